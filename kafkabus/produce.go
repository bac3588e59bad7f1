package kafkabus

// Publishing: records built from messages (CloudEvents headers, the
// Kafka protocol binding), produced at once and awaited one by one, and
// the conversion of records back into deliveries. Called from any
// goroutine; it holds no lock.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus/driver"
)

// Header names of the CloudEvents Kafka protocol binding (binary content
// mode); see the package comment for the rest of the mapping.
const (
	HeaderID           = "ce_id"
	HeaderType         = "ce_type"
	HeaderSource       = "ce_source"
	HeaderTime         = "ce_time"
	HeaderSpecVersion  = "ce_specversion"
	HeaderPartitionKey = "ce_partitionkey"
	HeaderContentType  = "content-type"
)

// record turns m into a Kafka record of topic.
func record(topic string, m *driver.Message) *kgo.Record {
	var s recordSet
	return &s.fill(topic, []*driver.Message{m}, false)[0]
}

// recordSet holds the records of a batch, their headers, and the bytes
// of every header value and key: three arrays for the whole batch (a
// record at a time was four allocations a message). A producing batch
// takes one from recordSets and gives it back once every record has its
// outcome (franz-go is done with a record when it calls its promise),
// so a publisher ahead of Kafka allocates no record memory in the
// steady state: it was ~520 B a message, a quarter of what an async
// publish allocated.
type recordSet struct {
	rs  []kgo.Record
	hs  []kgo.RecordHeader
	buf []byte
}

var recordSets = sync.Pool{New: func() any { return new(recordSet) }}

// fill turns msgs into Kafka records of topic, in s's arrays (grown as
// needed), and returns them. A value appended after a buffer grew stays
// where it was written. A record's value is its message's body, or a
// copy of it when copyBodies.
func (s *recordSet) fill(topic string, msgs []*driver.Message, copyBodies bool) []kgo.Record {
	nh, nb := 0, 0
	for _, m := range msgs {
		nh += 7 + len(m.Headers)
		nb += len(driver.SpecVersion) + len(m.ID) + len(m.Type) + len(m.Source) + 2*len(m.Key) + len(time.RFC3339Nano) + len(m.ContentType)
		for _, v := range m.Headers {
			nb += len(v)
		}
	}
	if cap(s.rs) < len(msgs) {
		s.rs = make([]kgo.Record, len(msgs))
	}
	if cap(s.hs) < nh {
		s.hs = make([]kgo.RecordHeader, 0, nh)
	}
	if cap(s.buf) < nb {
		s.buf = make([]byte, 0, nb)
	}
	rs, hs, buf := s.rs[:len(msgs)], s.hs[:0], s.buf[:0]
	var bodies [][]byte // not pooled: garbage once franz-go is done with the records
	if copyBodies {
		bodies = driver.CopyBodies(msgs)
	}
	for i, m := range msgs {
		first := len(hs)
		buf = driver.KafkaBinding.EncodeAppend(buf, m, func(name string, value []byte) {
			hs = append(hs, kgo.RecordHeader{Key: name, Value: value})
		})
		// The record timestamp is the publish time (kgo sets it), as
		// with the Java producer: retention and delivery timeouts count
		// from it, so a message re-published long after its Time (a dead
		// letter, an outbox relay) is neither expired at once nor timed
		// out. Time travels in ce_time.
		rs[i] = kgo.Record{Topic: topic, Value: m.Body, Headers: hs[first:len(hs):len(hs)]}
		r := &rs[i]
		if m.Key != "" {
			at := len(buf)
			buf = append(buf, m.Key...)
			r.Key = buf[at:len(buf):len(buf)]
		}
		if bodies != nil {
			r.Value = bodies[i]
		}
		if r.Value == nil {
			r.Value = []byte{} // an empty body, not a tombstone
		}
	}
	s.rs, s.hs, s.buf = rs, hs, buf
	return rs
}

// release forgets the messages' bodies and the batch's context (kgo
// sets a record's Context to the one it was produced with) and gives s
// back to recordSets. The rest of a record points into s's own arrays
// (or at header names), and fill overwrites it all: clearing every
// record and header cost as much as the rest of the batch's bookkeeping.
func (s *recordSet) release() {
	for i := range s.rs {
		s.rs[i].Value, s.rs[i].Context = nil, nil
	}
	recordSets.Put(s)
}

// Publish implements driver.Conn. The batch is produced at once and
// Publish waits for every record's acknowledgement at the durability
// asked for (acks 0, 1 or all); records that fail are reported one by one
// in a *driver.MessageErrors.
func (c *conn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	done := make(chan error, 1)
	// A Publish whose ctx can end returns when it ends, even while a
	// broker does not answer (kgo looks at ctx only between requests).
	// kgo then fails, unsent, the records it has not begun to write
	// (cancellation of idempotent records is allowed); one whose request
	// it was writing as ctx ended is still read after Publish returned, so
	// such records carry copies of their bodies.
	if err := c.queue(ctx, topic, msgs, opts, func(err error) { done <- err }, ctx.Done() != nil); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done: // finished at the same moment
			return err
		default:
			return fmt.Errorf("kafkabus: publish %q: %d message(s): %w: %w", topic, len(msgs), driver.ErrOutcomeUnknown, ctx.Err())
		}
	}
}

// Queue implements driver.Queuer: it produces the batch's records, in
// order, into the producer's buffer (waiting for room there while ctx
// allows) and calls done once every record has its outcome, with the
// records that failed reported one by one in a *driver.MessageErrors.
// franz-go's producer keeps a partition's records in order across its
// retries (idempotently at durability all), for as long as
// delivery_timeout. A record holds copies of its message's fields, its
// body apart: once Queue returns, only franz-go reads a message's body,
// until the record's promise.
func (c *conn) Queue(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions, done func(error)) error {
	return c.queue(ctx, topic, msgs, opts, done, false)
}

// queue is Queue, with the records' bodies copies of the messages' when
// copyBodies.
func (c *conn) queue(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions, done func(error), copyBodies bool) error {
	if err := c.checkOpen("publish", topic); err != nil {
		return err
	}
	if opts.DeadLetter {
		c.mu.Lock()
		c.dead[topic] = true
		c.mu.Unlock()
	}
	if len(msgs) == 0 {
		done(nil)
		return nil
	}
	if err := c.ensureTopic(ctx, "publish", topic); err != nil {
		return err
	}
	p, err := c.producer(opts.Durability)
	if err != nil {
		return fmt.Errorf("kafkabus: publish %q: %w", topic, err)
	}
	b := &queued{c: c, topic: topic, n: len(msgs), done: done, set: recordSets.Get().(*recordSet)}
	b.left.Store(int64(len(msgs)))
	rs := b.set.fill(topic, msgs, copyBodies)
	promise := b.promise // one closure for the batch, not one a record
	for i := range rs {
		p.Produce(ctx, &rs[i], promise)
	}
	return nil
}

// queued is a batch handed to the producer, until its last record's
// outcome. Promises may run on several of kgo's goroutines at once: mu
// guards errs.
type queued struct {
	c     *conn
	topic string
	n     int // records
	done  func(error)
	set   *recordSet // the records, given back after done
	left  atomic.Int64
	mu    sync.Mutex
	errs  []error // nil while every record landed
}

// promise is record r's promise.
func (b *queued) promise(r *kgo.Record, err error) {
	i := 0
	if err != nil {
		// Only a failure needs the record's place, for its message: a
		// search, instead of a closure a record that knows it.
		for i = range b.set.rs {
			if &b.set.rs[i] == r {
				break
			}
		}
	}
	b.settle(i, err)
}

// settle records the outcome of record i, and reports the batch's after
// the last.
func (b *queued) settle(i int, err error) {
	if err != nil {
		if errors.Is(err, driver.ErrNotFound) || errors.Is(classify(err), driver.ErrNotFound) {
			b.c.forget(b.topic)
		}
		cerr := classify(err)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			// The record's ctx ended (a Publisher closing, PublishTimeout):
			// franz-go fails it whether or not it was in a request
			// already, which a broker may have written.
			cerr = fmt.Errorf("%w: %w", cerr, driver.ErrOutcomeUnknown)
		}
		// The ID from the record: the messages are no longer read once
		// Queue returned (their publish may have returned since).
		err = fmt.Errorf("kafkabus: publish %q: message %q: %w", b.topic, recordID(&b.set.rs[i]), cerr)
		b.mu.Lock()
		if b.errs == nil {
			b.errs = make([]error, b.n)
		}
		b.errs[i] = err
		b.mu.Unlock()
	}
	if b.left.Add(-1) > 0 {
		return
	}
	b.mu.Lock()
	errs := b.errs
	b.mu.Unlock()
	// Every promise has been called: franz-go is done with the records.
	b.set.release()
	b.set = nil
	if errs != nil {
		b.done(&driver.MessageErrors{Errs: errs})
		return
	}
	b.done(nil)
}

// recordID is the ce_id of a record fill made.
func recordID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == HeaderID {
			return string(h.Value)
		}
	}
	return ""
}

// laneName is the lane id of partition p.
func laneName(p int32) string {
	if p >= 0 && int(p) < len(laneNames) {
		return laneNames[p]
	}
	return strconv.Itoa(int(p))
}

var laneNames = func() []string {
	s := make([]string, 256)
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

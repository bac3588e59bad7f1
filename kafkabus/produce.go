package kafkabus

// Publishing: records built from messages (CloudEvents headers, the
// Kafka protocol binding), produced at once and awaited one by one, and
// the conversion of records back into deliveries. Called from any
// goroutine; it holds no lock.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

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
	hs := make([]kgo.RecordHeader, 0, 7+len(m.Headers))
	driver.KafkaBinding.Encode(m, func(name, value string) {
		hs = append(hs, kgo.RecordHeader{Key: name, Value: []byte(value)})
	})
	// The record timestamp is the publish time (kgo sets it), as with the
	// Java producer: retention and delivery timeouts count from it, so a
	// message re-published long after its Time (a dead letter, an outbox
	// relay) is neither expired at once nor timed out. Time travels in
	// ce_time.
	r := &kgo.Record{Topic: topic, Value: m.Body, Headers: hs}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	if r.Value == nil {
		r.Value = []byte{} // an empty body, not a tombstone
	}
	return r
}

// Publish implements driver.Conn. The batch is produced at once and
// Publish waits for every record's acknowledgement at the durability
// asked for (acks 0, 1 or all); records that fail are reported one by one
// in a *driver.MessageErrors.
func (c *conn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if err := c.checkOpen("publish", topic); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	if opts.DeadLetter {
		c.mu.Lock()
		c.dead[topic] = true
		c.mu.Unlock()
	}
	if err := c.ensureTopic(ctx, "publish", topic); err != nil {
		return err
	}
	p, err := c.producer(opts.Durability)
	if err != nil {
		return fmt.Errorf("kafkabus: publish %q: %w", topic, err)
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = record(topic, m)
	}
	// kgo looks at ctx only between requests; Publish returns when ctx
	// ends even while a broker does not answer. The records then fail
	// inside kgo (cancellation of idempotent records is allowed), which
	// ends the goroutine.
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- p.ProduceSync(ctx, recs...) }()
	var results kgo.ProduceResults
	select {
	case results = <-done:
	case <-ctx.Done():
		select {
		case results = <-done: // finished at the same moment
		default:
			return fmt.Errorf("kafkabus: publish %q: %d message(s): %w: %w", topic, len(msgs), driver.ErrOutcomeUnknown, ctx.Err())
		}
	}
	var errs []error
	for _, r := range results {
		if r.Err == nil {
			continue
		}
		// Results come in completion order, not in the order given.
		i := slices.Index(recs, r.Record)
		if i < 0 {
			continue
		}
		if errs == nil {
			errs = make([]error, len(msgs))
		}
		if errors.Is(r.Err, driver.ErrNotFound) || errors.Is(classify(r.Err), driver.ErrNotFound) {
			c.forget(topic)
		}
		errs[i] = fmt.Errorf("kafkabus: publish %q: message %q: %w", topic, msgs[i].ID, classify(r.Err))
	}
	if errs != nil {
		return &driver.MessageErrors{Errs: errs}
	}
	return nil
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

// delivery turns a fetched record into a delivery.
func delivery(r *kgo.Record) *driver.Delivery {
	// The delivery and its position come in one allocation, and the
	// header values and the key share one string: what every consumed
	// record costs.
	x := &struct {
		d driver.Delivery
		p position
	}{p: position{partition: r.Partition, offset: r.Offset, epoch: r.LeaderEpoch}}
	d := &x.d
	d.Lane = laneName(r.Partition)
	d.Position = strconv.FormatInt(r.Offset, 10)
	d.Token = &x.p
	d.Body = r.Value
	n := len(r.Key)
	for _, h := range r.Headers {
		n += len(h.Value)
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, h := range r.Headers {
		sb.Write(h.Value)
	}
	sb.Write(r.Key)
	all, at := sb.String(), 0
	for _, h := range r.Headers {
		driver.KafkaBinding.Decode(&d.Message, h.Key, all[at:at+len(h.Value)])
		at += len(h.Value)
	}
	if driver.Structured(d.ContentType) {
		_ = driver.DecodeStructured(&d.Message) // one that is no CloudEvent stays as it came
	}
	if len(r.Key) > 0 {
		d.Key = all[at:] // the record key wins over ce_partitionkey
	}
	if d.ID == "" {
		// A record from a client that sets no ce_id: its place in the log
		// is an ID that stays the same across redeliveries.
		d.ID = r.Topic + "/" + d.Lane + "/" + d.Position
	}
	if d.Time.IsZero() {
		d.Time = r.Timestamp
	}
	return d
}

// position is what a delivery's Token points to: what a commit needs.
type position struct {
	partition int32
	offset    int64
	epoch     int32
}

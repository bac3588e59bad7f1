package rabbitbus

// Run counts: how many holders ran each redelivered message of a
// partitioned group (driver.RunCounter), so that a message a crashed
// member held and never ran is not dead-lettered with the one that
// crashed it. RabbitMQ has no key-value store, so the group keeps an
// append-only log of run records in a stream queue of its own
// (runsQueue), and every member tails it from the first record into a
// map, on a goroutine the sub owns (runs.tail, ended by Close).
// CountRun runs on the engine's workers; runs.mu guards the map and the
// waiting records.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// The run records' stream: records are written only for suspects, so it
// stays small. Retention drops whole segments, hence the small segment:
// a record older than a day goes, and a message still unsettled after a
// day counts its holders afresh (more runs, never an innocent dead
// letter).
const (
	runsMaxAge    = "1D"
	runsSegment   = 1 << 20
	runsMaxLength = 64 << 20
	// runsWait bounds how long CountRun waits to read its own record
	// back; past it the engine runs the message uncounted.
	runsWait = 30 * time.Second
	// Record headers: the message's key in the group's count (lane and
	// message ID), and the holder that ran it, or "done": the message was
	// acknowledged, its count goes.
	hdrRunKey    = "omnibus-run-key"
	hdrRunHolder = "omnibus-run-holder"
	hdrRunDone   = "omnibus-run-done"
)

// runsQueue names a partitioned group's stream of run records. No
// partition queue ends so ("<topic>:<group>:<number>").
func runsQueue(topic, group string) string { return topic + ":" + group + ":runs" }

func declareRuns(ch *amqp.Channel, name string) error {
	_, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg:                 amqp.QueueTypeStream,
		amqp.StreamMaxAgeArg:              runsMaxAge,
		amqp.StreamMaxSegmentSizeBytesArg: int32(runsSegment),
		amqp.QueueMaxLenBytesArg:          int64(runsMaxLength),
	})
	return err
}

// runs is a member's view of its group's run records.
type runs struct {
	s      *sub
	queue  string
	holder string // this member, in its records: a process that restarts is another holder

	mu      sync.Mutex
	ran     map[string]map[string]bool // record key -> holders that ran the message
	waiting map[string]chan int        // a record's ID -> its count, once read back
}

func newRuns(s *sub) *runs {
	return &runs{
		s: s, queue: runsQueue(s.topic, s.group),
		holder:  strconv.FormatUint(rand.Uint64(), 36),
		ran:     map[string]map[string]bool{},
		waiting: map[string]chan int{},
	}
}

// countingSub is a partitioned member that counts runs. A throwaway
// group has no run records (a stream cannot expire with its queues): its
// member is a partSub, whose Attempt is the transport's.
type countingSub struct{ partSub }

var _ driver.RunCounter = countingSub{}

// CountRun implements driver.RunCounter. A partition's Attempt is the
// quorum queue's x-delivery-count, which rises for each holder whose
// channel closed with the message unacknowledged: also for the messages
// a crashed member held behind the one that crashed it, which it never
// ran, and those would reach MaxAttempts with the poisoned one. So
// CountRun appends a record (this holder ran the message) to the group's
// stream, with a publisher confirm, and waits until the member's tail
// reads it back: by then it has read every record before it, whoever
// wrote them, and the count is the holders recorded for the message up
// to this record, plus its first holder, which ran it unrecorded. The
// same holder counts once. A message without an ID keeps the
// transport's count.
func (c countingSub) CountRun(ctx context.Context, d *driver.Delivery) (int, error) {
	s := c.s
	if _, ok := d.Token.(*token); !ok {
		return 0, fmt.Errorf("rabbitbus: count runs on %q: delivery of lane %q is not from rabbitbus: %w", s.topic, d.Lane, driver.ErrInvalid)
	}
	if d.Message.ID == "" {
		return d.Attempt, nil
	}
	key := d.Lane + "/" + d.Message.ID
	n, err := s.runs.count(ctx, key)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	d.Token.(*token).run = key // Ack says it is done
	s.mu.Unlock()
	return n, nil
}

// count records that this holder runs the message of key and returns how
// many holders did.
func (r *runs) count(ctx context.Context, key string) (int, error) {
	s := r.s
	id := strconv.FormatUint(rand.Uint64(), 36)
	got := make(chan int, 1)
	r.mu.Lock()
	r.waiting[id] = got
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.waiting, id)
		r.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, runsWait)
	defer cancel()
	_, err := s.c.withChannel(ctx, s.link, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", r.queue, true, false, amqp.Publishing{
			MessageId:    id,
			DeliveryMode: amqp.Persistent,
			Headers:      amqp.Table{hdrRunKey: key, hdrRunHolder: r.holder},
		})
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("the server refused the record (nack): %w", driver.ErrRetryable)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("rabbitbus: count runs on %q group %q: record in %q: %w", s.topic, s.group, r.queue, err)
	}
	select {
	case n := <-got:
		return n, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("rabbitbus: count runs on %q group %q: read the record back from %q: %w: %w", s.topic, s.group, r.queue, ctx.Err(), driver.ErrRetryable)
	}
}

// done records that the messages of keys were acknowledged, so that
// their counts go from every member's map (a message published again
// with the same ID starts afresh, as it does in a partition queue). It
// waits for no confirm: a record lost leaves a count behind until the
// stream's retention drops it, which only takes room, or counts a
// message of the same ID again too high.
func (r *runs) done(ctx context.Context, keys []string) error {
	_, err := r.s.c.withChannel(ctx, r.s.link, func(ch *amqp.Channel) error {
		for _, key := range keys {
			if err := ch.PublishWithContext(ctx, "", r.queue, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent,
				Headers:      amqp.Table{hdrRunKey: key, hdrRunDone: true},
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rabbitbus: forget run counts on %q group %q in %q: %w", r.s.topic, r.s.group, r.queue, err)
	}
	return nil
}

// read applies one record, in the stream's order, and hands its count to
// the CountRun waiting for it.
func (r *runs) read(d *amqp.Delivery) {
	key, holder := str(d.Headers[hdrRunKey]), str(d.Headers[hdrRunHolder])
	_, done := d.Headers[hdrRunDone]
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case key == "":
		return // not a record
	case done:
		delete(r.ran, key)
		return
	case holder == "":
		return // not a record
	}
	hs := r.ran[key]
	if hs == nil {
		hs = map[string]bool{}
		r.ran[key] = hs
	}
	hs[holder] = true
	if w := r.waiting[d.MessageId]; w != nil {
		select {
		case w <- len(hs) + 1:
		default:
		}
	}
}

// tail reads the group's run records from the first, again from the
// first after a drop, until Close.
func (r *runs) tail() { r.s.consumeUntilClosed(r.queue, "reading run records", r.open, r.serve) }

func (r *runs) open(ac *amqp.Connection) (*amqp.Channel, <-chan amqp.Delivery, error) {
	r.s.c.record("q", r.queue)
	// A stream consumer needs a prefetch and manual acks; the acks only
	// give it credit.
	return openConsumer(ac, r.queue, 256, amqp.Table{"x-stream-offset": "first"},
		func(ch *amqp.Channel) error { return declareRuns(ch, r.queue) })
}

// serve applies the channel's records, the stream's from the first,
// until the channel closes or the member does.
func (r *runs) serve(ch *amqp.Channel, dels <-chan amqp.Delivery) {
	defer func() { _ = ch.Close() }()
	r.mu.Lock()
	clear(r.ran) // the stream is read again whole
	r.mu.Unlock()
	for {
		select {
		case d, ok := <-dels:
			if !ok {
				return
			}
			r.read(&d)
			_ = d.Ack(false)
		case <-r.s.ctx.Done():
			_ = ch.Close()
			for range dels {
			}
			return
		}
	}
}

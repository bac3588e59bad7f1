package natsbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// unorderedLane is the lane of an unpartitioned topic.
const unorderedLane = "0"

// Subscribe implements driver.Conn. On an unpartitioned topic the group
// is one durable pull consumer whose members compete for messages on a
// single unordered lane; on a partitioned topic see subscribePartitioned.
func (c *conn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	if err := checkTopic("subscribe", topic); err != nil {
		return nil, err
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	ref, err := c.stream(ctx, topic, 0)
	if err != nil {
		return nil, err
	}
	if ref.parts > 0 {
		return c.subscribePartitioned(ctx, topic, ref, opts)
	}
	s := newSub(c, topic, ref, opts)
	name := safeName(opts.Group)
	cons, err := c.consumer(ctx, ref, name, consumerSpec{start: opts.StartAt, maxAckPending: s.maxAckPending(), ephemeral: opts.Ephemeral})
	if err != nil {
		return nil, fmt.Errorf("natsbus: subscribe %q group %q: %w", topic, opts.Group, err)
	}
	r, err := s.newReader(unorderedLane, cons)
	if err != nil {
		return nil, fmt.Errorf("natsbus: subscribe %q group %q: %w", topic, opts.Group, classify(err))
	}
	if err := c.addSub(s); err != nil {
		r.stopAndWait()
		return nil, fmt.Errorf("natsbus: subscribe %q: %w", topic, err)
	}
	if opts.Ephemeral {
		c.joinEphemeral(ref.name, opts.Group)
		s.cleanup = func(ctx context.Context) {
			if c.leaveEphemeral(ref.name, opts.Group) {
				_ = c.js.DeleteConsumer(ctx, ref.name, name)
			}
		}
	}
	opts.Lanes.Claimed([]string{unorderedLane})
	s.mu.Lock()
	s.readers[unorderedLane] = r
	s.mu.Unlock()
	s.startPump(r)
	s.startKeeper()
	return s, nil
}

// maxAckPending is the consumer's MaxAckPending: the URL's, or 16 ×
// MaxInFlight.
func (s *sub) maxAckPending() int {
	if n := s.c.cfg.maxAckPending; n > 0 {
		return n
	}
	return 16 * s.opts.MaxInFlight
}

// DefaultEphemeralInactive is how long the server keeps the consumer of a
// throwaway group (one the user did not name) after its last member
// stopped pulling, when the URL sets no inactive_threshold. Members that
// leave normally delete it at once; this covers a crashed process.
const DefaultEphemeralInactive = 5 * time.Minute

// consumerSpec is how a group's consumer is created when it is missing.
type consumerSpec struct {
	filter        string // partition subject; "" for the whole stream
	start         driver.StartAt
	startSeq      uint64 // > 0: DeliverByStartSequence (partitioned groups)
	maxAckPending int
	ephemeral     bool
}

// consumer returns the durable consumer name of stream ref, creating it
// as spec says when missing. An existing consumer keeps its position and
// delivery policy; its MaxAckPending is raised to spec's when lower.
func (c *conn) consumer(ctx context.Context, ref *streamRef, name string, spec consumerSpec) (jetstream.Consumer, error) {
	for try := 0; ; try++ {
		cons, err := c.js.Consumer(ctx, ref.name, name)
		if err == nil {
			cfg := cons.CachedInfo().Config
			if cfg.MaxAckPending >= spec.maxAckPending || cfg.MaxAckPending < 0 {
				return cons, nil
			}
			cfg.MaxAckPending = spec.maxAckPending
			up, err := c.js.UpdateConsumer(ctx, ref.name, cfg)
			if err != nil {
				return cons, nil // keep the smaller window rather than fail
			}
			return up, nil
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, fmt.Errorf("consumer %q of stream %q: %w", name, ref.name, classify(err))
		}
		cc := jetstream.ConsumerConfig{
			Durable:           name,
			DeliverPolicy:     jetstream.DeliverNewPolicy,
			AckPolicy:         jetstream.AckExplicitPolicy,
			AckWait:           c.cfg.ackWait,
			MaxDeliver:        -1, // the engine counts attempts and dead-letters
			MaxAckPending:     spec.maxAckPending,
			FilterSubject:     spec.filter,
			InactiveThreshold: c.cfg.inactive,
		}
		switch {
		case spec.start == driver.StartEarliest:
			cc.DeliverPolicy = jetstream.DeliverAllPolicy
		case spec.startSeq > 0:
			cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, spec.startSeq
		}
		if spec.ephemeral {
			cc.Description = "omnibus throwaway group"
			if cc.InactiveThreshold == 0 {
				cc.InactiveThreshold = DefaultEphemeralInactive
			}
		}
		cons, err = c.js.CreateConsumer(ctx, ref.name, cc)
		if err == nil {
			return cons, nil
		}
		if !errors.Is(err, jetstream.ErrConsumerExists) || try >= 3 {
			return nil, fmt.Errorf("create consumer %q of stream %q: %w", name, ref.name, classify(err))
		}
	}
}

// sub is one group member.
//
// Goroutines: one pump per reader (a claimed lane's consumer), feeding
// the inbox; the keeper, sending in-progress signals for deliveries held
// long; in partitioned mode the lease goroutines (see partitioned). All
// end in Close.
type sub struct {
	c      *conn
	topic  string
	ref    *streamRef
	opts   driver.SubscribeOptions
	inbox  *inbox
	closed chan struct{}
	wg     sync.WaitGroup

	wake chan struct{} // makes a Receive in progress return: a lane is going
	part *partitioned  // nil on an unpartitioned topic

	// Receive's own: calls never overlap.
	batch  []item
	carry  []*driver.Delivery // received, did not fit in the last Receive
	failed error              // a read error to return from the next Receive

	// cleanup runs in Close after the readers stopped (ephemeral groups
	// delete their consumer there); nil when there is nothing to do.
	cleanup func(ctx context.Context)

	mu      sync.Mutex
	readers map[string]*reader // by lane
	held    heldList           // deliveries not yet acked, for in-progress signals

	closeOnce sync.Once
}

type item struct {
	r   *reader
	msg jetstream.Msg
	err error
}

// reader reads one lane: a durable consumer and its pull iterator.
type reader struct {
	lane    string
	cons    jetstream.Consumer
	itMu    sync.Mutex // guards it, replaced by the pump after an error
	it      jetstream.MessagesContext
	stopped atomic.Bool
	stop    chan struct{}
	done    chan struct{}

	// Partitioned mode: the lane's lease. After deadline (unix
	// nanoseconds; 0 without a lease) or once lost, the lane may belong
	// to another member: nothing more of it is delivered, acknowledged or
	// kept in progress.
	deadline atomic.Int64
	lost     atomic.Bool
	acked    atomic.Uint64 // highest stream sequence acknowledged
}

// valid reports whether r's deliveries may still be handed out and
// acknowledged. Once the lease's deadline passed, r is lost for good,
// even if a late refresh succeeds: handing out what follows a message
// dropped meanwhile would break the lane's order, so the lane is given
// up (Lanes.Lost) and claimed afresh at its ack floor.
func (r *reader) valid(now time.Time) bool {
	if r.lost.Load() {
		return false
	}
	if dl := r.deadline.Load(); dl != 0 && now.UnixNano() >= dl {
		r.lost.Store(true)
		return false
	}
	return true
}

func newSub(c *conn, topic string, ref *streamRef, opts driver.SubscribeOptions) *sub {
	return &sub{
		c: c, topic: topic, ref: ref, opts: opts,
		inbox:   newInbox(),
		closed:  make(chan struct{}),
		wake:    make(chan struct{}, 1),
		readers: map[string]*reader{},
	}
}

func (s *sub) newReader(lane string, cons jetstream.Consumer) (*reader, error) {
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * s.opts.MaxInFlight))
	if err != nil {
		return nil, err
	}
	return &reader{lane: lane, cons: cons, it: it, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

func (s *sub) startPump(r *reader) {
	s.wg.Add(1)
	go s.pump(r)
}

// pump moves messages from r's iterator to the inbox until r stops.
func (s *sub) pump(r *reader) {
	defer s.wg.Done()
	defer close(r.done)
	failures := 0
	for {
		r.itMu.Lock()
		it := r.it
		r.itMu.Unlock()
		msg, err := it.Next()
		if err != nil {
			if r.stopped.Load() || !s.inbox.put(item{r: r, err: err}, r.stop, s.closed) {
				return
			}
			if errors.Is(classify(err), driver.ErrNotFound) || errors.Is(classify(err), driver.ErrClosed) || s.c.nc.IsClosed() {
				return
			}
			// Not terminal: start a new iterator after a pause.
			failures++
			select {
			case <-time.After(min(time.Duration(failures)*250*time.Millisecond, 5*time.Second)):
			case <-r.stop:
				return
			}
			it.Stop()
			if next, err := r.cons.Messages(jetstream.PullMaxMessages(2 * s.opts.MaxInFlight)); err == nil {
				r.itMu.Lock()
				r.it = next
				r.itMu.Unlock()
				if r.stopped.Load() {
					next.Stop()
				}
			}
			continue
		}
		failures = 0
		if !s.inbox.put(item{r: r, msg: msg}, r.stop, s.closed) {
			return
		}
	}
}

// stopAndWait stops r's iterator and waits for its pump.
func (r *reader) stopAndWait() {
	if r.stopped.CompareAndSwap(false, true) {
		close(r.stop)
		r.itMu.Lock()
		r.it.Stop()
		r.itMu.Unlock()
	}
}

// Receive implements driver.Subscriber. It returns what the inbox holds
// and fits in room, waiting only while the inbox is empty; deliveries
// that did not fit wait in carry for the next Receive. A failed read is
// returned on its own: when deliveries come with it, by the next Receive.
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	if err := s.failed; err != nil {
		s.failed = nil
		return nil, err
	}
	for {
		took := 0
		if len(s.carry) == 0 {
			s.batch = s.inbox.take(s.batch[:0], max(1, room.Count))
			took = len(s.batch)
			now := time.Now()
			for i, it := range s.batch {
				d, err := s.delivery(it, now)
				if err != nil && s.failed == nil {
					s.failed = err
				}
				if d != nil {
					s.carry = append(s.carry, d)
				}
				s.batch[i] = item{}
			}
		}
		if ds := s.fit(room); len(ds) > 0 || len(s.carry) > 0 {
			return ds, nil
		}
		if err := s.failed; err != nil {
			s.failed = nil
			return nil, err
		}
		if took > 0 {
			continue // all were of lanes given up: look again
		}
		select {
		case <-s.inbox.ready:
		case <-s.wake:
			return nil, nil // a lane is being revoked or lost
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closed:
			return nil, fmt.Errorf("natsbus: receive %q: %w", s.topic, driver.ErrClosed)
		}
	}
}

// fit takes from carry the deliveries that fit in room, in order,
// dropping those of lanes given up meanwhile.
func (s *sub) fit(room driver.Room) []*driver.Delivery {
	var ds []*driver.Delivery
	now := time.Now()
	bytes, i := 0, 0
	for ; i < len(s.carry); i++ {
		d := s.carry[i]
		if r := d.Token.(*held).r; r.stopped.Load() || !r.valid(now) {
			continue
		}
		size := d.Size()
		if !room.Fits(len(ds), bytes, size) {
			break
		}
		bytes += size
		ds = append(ds, d)
	}
	rest := copy(s.carry, s.carry[i:])
	clear(s.carry[rest:])
	s.carry = s.carry[:rest]
	return ds
}

// delivery converts an item, received at now; nil when it belongs to a
// lane given up.
func (s *sub) delivery(it item, now time.Time) (*driver.Delivery, error) {
	if it.r.stopped.Load() || !it.r.valid(now) {
		return nil, nil
	}
	if it.err != nil {
		err := classify(it.err)
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) && s.c.nc.IsClosed() {
			err = fmt.Errorf("%w: %w", err, driver.ErrClosed)
		}
		if errors.Is(err, driver.ErrNotFound) {
			s.c.forget(s.topic)
		}
		return nil, fmt.Errorf("natsbus: receive %q lane %s: %w", s.topic, it.r.lane, err)
	}
	md, err := it.msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("natsbus: receive %q lane %s: %w", s.topic, it.r.lane, err)
	}
	h := &held{r: it.r, seq: md.Sequence.Stream, msg: it.msg, since: now, first: now}
	h.d = driver.Delivery{
		Lane:     it.r.lane,
		Position: strconv.FormatUint(h.seq, 10),
		Attempt:  int(md.NumDelivered),
		Token:    h,
	}
	fromMsg(&h.d.Message, it.msg.Headers(), it.msg.Data())
	s.mu.Lock()
	s.held.push(h)
	s.mu.Unlock()
	return &h.d, nil
}

// take removes the deliveries from the held set and returns their
// messages, leaving out those of lanes whose lease ran out (the lane's
// next owner reads them again). With ack, it records the highest
// sequence acknowledged per reader.
func (s *sub) take(ds []*driver.Delivery, ack bool) []jetstream.Msg {
	msgs := make([]jetstream.Msg, 0, len(ds))
	now := time.Now()
	s.mu.Lock()
	for _, d := range ds {
		h, ok := d.Token.(*held)
		if !ok {
			continue
		}
		if s.held.remove(h) && h.r.valid(now) {
			msgs = append(msgs, h.msg)
			if ack && h.seq > h.r.acked.Load() {
				h.r.acked.Store(h.seq) // under s.mu: no lost update
			}
		}
	}
	s.mu.Unlock()
	return msgs
}

// Ack implements driver.Acker. The acknowledgements are written to the
// connection; a lost one means a redelivery, never a loss.
func (s *sub) Ack(_ context.Context, ds []*driver.Delivery) error {
	var errs []error
	for _, m := range s.take(ds, true) {
		if err := m.Ack(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("natsbus: ack %q: %d of %d failed: %w", s.topic, len(errs), len(ds), classify(errors.Join(errs...)))
	}
	return nil
}

// Nack implements driver.Nacker with NakWithDelay.
func (s *sub) Nack(_ context.Context, ds []*driver.Delivery, delay time.Duration) error {
	var errs []error
	for _, m := range s.take(ds, false) {
		if err := m.NakWithDelay(delay); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("natsbus: nack %q: %d of %d failed: %w", s.topic, len(errs), len(ds), classify(errors.Join(errs...)))
	}
	return nil
}

// maxHold bounds how long in-progress signals keep a delivery from being
// redelivered.
func (s *sub) maxHold() time.Duration { return max(10*s.c.cfg.ackWait, 5*time.Minute) }

// startKeeper starts the goroutine that tells the server a delivery held
// longer than half of AckWait is still in progress, so slow handlers and
// retries waiting in the engine do not cause redeliveries.
func (s *sub) startKeeper() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		wait := s.c.cfg.ackWait
		t := time.NewTicker(max(wait/4, 50*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-s.closed:
				return
			case now := <-t.C:
				var due []jetstream.Msg
				s.mu.Lock()
				for h := range s.held.all() {
					switch {
					case !h.r.valid(now):
						s.held.remove(h) // the lease ran out
					case now.Sub(h.first) > s.maxHold():
						s.held.remove(h) // let the server redeliver it
					case now.Sub(h.since) > wait/2:
						h.since = now
						due = append(due, h.msg)
					}
				}
				s.mu.Unlock()
				for _, m := range due {
					_ = m.InProgress()
				}
			}
		}
	}()
}

// Lag implements driver.LagReader: num_pending + num_ack_pending of the
// consumer of every lane this member holds. A failed read is Known false.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	s.mu.Lock()
	readers := make([]*reader, 0, len(s.readers))
	for _, r := range s.readers {
		readers = append(readers, r)
	}
	s.mu.Unlock()
	lags := make([]driver.LaneLag, 0, len(readers))
	for _, r := range readers {
		l := driver.LaneLag{Lane: r.lane}
		if info, err := r.cons.Info(ctx); err == nil {
			l.Lag, l.Known = int64(info.NumPending)+int64(info.NumAckPending), true
		}
		lags = append(lags, l)
	}
	return lags, nil
}

// Close implements driver.Subscriber: it stops reading. Unacknowledged
// deliveries are redelivered after AckWait (in partitioned mode the
// member first releases its leases; see the package documentation); the
// durable consumer (the group's position) stays, except for a throwaway
// group's last member, which deletes it.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		if s.part != nil {
			s.part.stop()
		}
		s.mu.Lock()
		readers := s.readers
		s.readers = map[string]*reader{}
		s.mu.Unlock()
		for _, r := range readers {
			r.stopAndWait()
		}
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if s.part != nil {
			s.part.leave(ctx)
		}
		s.mu.Lock()
		s.held.clear()
		s.mu.Unlock()
		if s.cleanup != nil {
			s.cleanup(ctx)
		}
		s.c.removeSub(s)
	})
	return nil
}

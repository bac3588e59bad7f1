package natsbus

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	fail := func(err error) (driver.Subscriber, error) {
		return nil, fmt.Errorf("natsbus: subscribe %q group %q: %w", topic, opts.Group, err)
	}
	s := newSub(c, topic, ref, opts)
	if !opts.Ephemeral {
		// Nobody resumes a throwaway group: it keeps no positions, and
		// its consumer deleted behind its back is an error.
		if s.pos, err = c.positions(ctx, ref, opts.Group); err != nil {
			return fail(err)
		}
	}
	if err := s.join(ctx); err != nil {
		return fail(err)
	}
	cons, err := s.consumer(ctx, unorderedLane)
	if err != nil {
		return fail(err)
	}
	r, err := s.newReader(unorderedLane, cons, false)
	if err != nil {
		return fail(classify(err))
	}
	if err := c.addSub(s); err != nil {
		r.halt(false)
		return nil, fmt.Errorf("natsbus: subscribe %q: %w", topic, err)
	}
	if opts.Ephemeral {
		c.joinEphemeral(ref.name, opts.Group)
		s.cleanup = func(ctx context.Context) {
			if c.leaveEphemeral(ref.name, opts.Group) {
				_ = c.js.DeleteConsumer(ctx, ref.name, s.consumerName(unorderedLane))
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

// lanes are the group's lanes: "0" on an unpartitioned topic, "0" ...
// "N-1" on a partitioned one.
func (s *sub) lanes() []string {
	if s.ref.parts == 0 {
		return []string{unorderedLane}
	}
	ls := make([]string, s.ref.parts)
	for p := range ls {
		ls[p] = strconv.Itoa(p)
	}
	return ls
}

// consumerName is the durable consumer of lane.
func (s *sub) consumerName(lane string) string {
	if s.ref.parts == 0 {
		return safeName(s.opts.Group)
	}
	p, _ := strconv.Atoi(lane)
	return partitionConsumer(s.opts.Group, p)
}

// join makes sure the group has a consumer and a recorded position for
// every lane. A new group (no consumer and no position anywhere) starts
// every lane at the same sequence: the stream's next (StartLatest) or its
// first (StartEarliest). A lane missing from a group that exists resumes
// at its recorded position, or, without one, at the stream's first
// message (redeliveries rather than a loss).
func (s *sub) join(ctx context.Context) error {
	exists := false
	var missing []string
	for _, lane := range s.lanes() {
		cons, err := s.c.js.Consumer(ctx, s.ref.name, s.consumerName(lane))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			if s.pos != nil {
				if _, _, ok, err := s.pos.get(ctx, lane); err != nil {
					return err
				} else if ok {
					exists = true
				}
			}
			missing = append(missing, lane)
			continue
		}
		if err != nil {
			return fmt.Errorf("consumer %q of stream %q: %w", s.consumerName(lane), s.ref.name, classify(err))
		}
		exists = true
		if next, ok := resumeSeq(cons.CachedInfo()); ok && s.pos != nil {
			if _, err := s.pos.init(ctx, lane, next); err != nil {
				return err
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	start := uint64(1)
	if !exists && s.opts.StartAt == driver.StartLatest {
		st, err := s.c.js.Stream(ctx, s.ref.name)
		if err != nil {
			return fmt.Errorf("stream %q: %w", s.ref.name, classify(err))
		}
		start = st.CachedInfo().State.LastSeq + 1
	}
	for _, lane := range missing {
		next := start
		if s.pos != nil {
			var err error
			if next, err = s.pos.init(ctx, lane, start); err != nil {
				return err
			}
		}
		if _, err := s.create(ctx, lane, next); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return err
		}
	}
	return nil
}

// consumer returns lane's consumer. When it is missing (deleted behind
// the group's back, or removed by inactive_threshold) it is created again
// at the lane's recorded position (at the stream's first message without
// one), never at the end of the stream. A throwaway group records no
// position: its missing consumer is an error wrapping ErrNotFound.
// An existing consumer's MaxAckPending is raised to the member's when
// lower.
func (s *sub) consumer(ctx context.Context, lane string) (jetstream.Consumer, error) {
	name := s.consumerName(lane)
	for try := 0; ; try++ {
		cons, err := s.c.js.Consumer(ctx, s.ref.name, name)
		if err == nil {
			cfg := cons.CachedInfo().Config
			if cfg.MaxAckPending >= s.maxAckPending() || cfg.MaxAckPending < 0 {
				return cons, nil
			}
			cfg.MaxAckPending = s.maxAckPending()
			if up, err := s.c.js.UpdateConsumer(ctx, s.ref.name, cfg); err == nil {
				return up, nil
			}
			return cons, nil // keep the smaller window rather than fail
		}
		if !errors.Is(err, jetstream.ErrConsumerNotFound) || s.pos == nil {
			return nil, fmt.Errorf("consumer %q of stream %q: %w", name, s.ref.name, classify(err))
		}
		next, _, ok, err := s.pos.get(ctx, lane)
		if err != nil {
			return nil, err
		}
		if !ok {
			next = 1
		}
		cons, err = s.create(ctx, lane, next)
		if err == nil || !errors.Is(err, jetstream.ErrConsumerExists) || try >= 3 {
			return cons, err
		}
	}
}

// create creates lane's consumer starting at stream sequence next.
func (s *sub) create(ctx context.Context, lane string, next uint64) (jetstream.Consumer, error) {
	cc := jetstream.ConsumerConfig{
		Durable:           s.consumerName(lane),
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       next,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           s.c.cfg.ackWait,
		MaxDeliver:        -1, // the engine counts attempts and dead-letters
		MaxAckPending:     s.maxAckPending(),
		InactiveThreshold: s.c.cfg.inactive,
	}
	if s.ref.parts > 0 {
		p, _ := strconv.Atoi(lane)
		cc.FilterSubject = partitionSubject(s.topic, p)
		s.c.pin(&cc)
	}
	if s.opts.Ephemeral {
		cc.Description = "omnibus throwaway group"
		if cc.InactiveThreshold == 0 {
			cc.InactiveThreshold = DefaultEphemeralInactive
		}
	}
	cons, err := s.c.js.CreateConsumer(ctx, s.ref.name, cc)
	if err != nil {
		return nil, fmt.Errorf("create consumer %q of stream %q at sequence %d: %w", cc.Durable, s.ref.name, next, classify(err))
	}
	return cons, nil
}

// sub is one group member.
//
// Goroutines: one pump per reader (a claimed lane's consumer), feeding
// the inbox; the keeper, sending in-progress signals for what the member
// holds and recording the group's positions; in partitioned mode the
// lease goroutines (see partitioned). All end in Close.
type sub struct {
	c      *conn
	topic  string
	ref    *streamRef
	opts   driver.SubscribeOptions
	pos    *positions // nil for a throwaway unpartitioned group
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
	held    heldList           // pulled and not yet settled: in-progress signals, hand-back on Close

	closeOnce sync.Once
}

type item struct {
	r   *reader
	h   *held
	err error
}

// reader reads one lane: a durable consumer and its pull iterator.
type reader struct {
	lane    string
	itMu    sync.Mutex // guards cons and it, replaced by the pump after an error
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	stopped atomic.Bool
	stop    chan struct{}
	done    chan struct{}

	// exclusive is set for a partition's reader: the only one meant to
	// read its consumer, so a redelivery it pulls is normally of a
	// message it pulled before (see sub.hold). Guarded by sub.mu: top,
	// the highest stream sequence pulled; pulled, the sequences pulled
	// above floor, ascending (at most maxPulled); floor, the consumer's
	// ack floor when last read; nacked, the sequences handed back with
	// Nack and due to come again.
	exclusive bool
	top       uint64
	pulled    []uint64
	floor     uint64
	nacked    map[uint64]struct{}
	// recent is the last sequences this reader acknowledged (a ring, next
	// write at recentAt), for a plain reader to know a second delivery of
	// one. Guarded by sub.mu.
	recent   [recentAcks]uint64
	recentAt int

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

// maxPulled bounds the sequences a partition's reader remembers between
// two reads of its ack floor (recordEvery): past it, the oldest are
// forgotten, and a copy of one of those is handed on (a duplicate, never
// a loss).
const maxPulled = 1 << 20

// pulledLocked reports whether r pulled seq: at or below the consumer's
// ack floor (settled on the server), or remembered. Called with sub.mu.
func (r *reader) pulledLocked(seq uint64) bool {
	if seq <= r.floor {
		return true
	}
	_, found := slices.BinarySearch(r.pulled, seq)
	return found
}

// pullLocked remembers that r pulled seq, above any it pulled before.
// Called with sub.mu.
// recentAcks is how many acknowledged sequences a plain reader remembers.
const recentAcks = 256

// ackedRecentlyLocked reports whether r acknowledged seq lately.
func (r *reader) ackedRecentlyLocked(seq uint64) bool {
	for _, q := range r.recent {
		if q == seq {
			return true
		}
	}
	return false
}

func (r *reader) pullLocked(seq uint64) {
	r.top = max(r.top, seq)
	if !r.exclusive {
		return
	}
	if len(r.pulled) >= maxPulled {
		r.pulled = slices.Delete(r.pulled, 0, maxPulled/2)
	}
	r.pulled = append(r.pulled, seq)
}

// raiseFloorLocked records the consumer's ack floor: what is at or below
// it need not be remembered. Called with sub.mu.
func (r *reader) raiseFloorLocked(floor uint64) {
	if floor <= r.floor {
		return
	}
	r.floor = floor
	n, _ := slices.BinarySearch(r.pulled, floor+1)
	r.pulled = slices.Delete(r.pulled, 0, n)
}

// consumer returns r's current consumer.
func (r *reader) consumer() jetstream.Consumer {
	r.itMu.Lock()
	defer r.itMu.Unlock()
	return r.cons
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

// pullExpiry is how long a pull request waits on the server. The pull
// iterator learns of a request the server dropped without a word (one
// that reached a consumer being deleted: "no responders") only when
// heartbeats stop, after pullExpiry; nats.go's default is 30s.
const pullExpiry = 5 * time.Second

// messages starts a pull on cons, sized to the engine's bounds: at most
// MaxInFlight messages buffered, and requests of at most MaxInFlightBytes
// (never less than the largest message the server accepts, which would
// stall the pull). A pinned partition consumer is pulled in its priority
// group.
func (s *sub) messages(cons jetstream.Consumer) (jetstream.MessagesContext, error) {
	n := max(1, s.opts.MaxInFlight)
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(n), jetstream.PullExpiry(pullExpiry)}
	if b := s.opts.MaxInFlightBytes; b > 0 {
		opts[0] = jetstream.PullMaxMessagesWithBytesLimit(n, max(b, int(s.c.nc.MaxPayload())+4096))
	}
	if pinned(cons.CachedInfo()) {
		opts = append(opts, jetstream.PullPriorityGroup(pinGroup))
	}
	return cons.Messages(opts...)
}

func (s *sub) newReader(lane string, cons jetstream.Consumer, exclusive bool) (*reader, error) {
	it, err := s.messages(cons)
	if err != nil {
		return nil, err
	}
	r := &reader{lane: lane, cons: cons, it: it, stop: make(chan struct{}), done: make(chan struct{}), exclusive: exclusive}
	if exclusive {
		r.nacked = map[uint64]struct{}{}
	}
	return r, nil
}

func (s *sub) startPump(r *reader) {
	s.wg.Add(1)
	go s.pump(r)
}

// pump moves messages from r's iterator to the inbox until r stops,
// holding each from the moment it is pulled. Once r stops, it empties
// what the iterator still buffers (see halt): handed back with Nak when
// the member leaves an unpartitioned group, dropped otherwise (the
// partition's next owner resets its consumer).
func (s *sub) pump(r *reader) {
	defer s.wg.Done()
	defer close(r.done)
	failures := 0
	for {
		r.itMu.Lock()
		it := r.it
		r.itMu.Unlock()
		msg, err := it.Next()
		if r.stopped.Load() {
			if err != nil {
				return
			}
			if s.part == nil {
				_ = msg.Nak()
			}
			continue
		}
		if err == nil {
			failures = 0
			h, err := s.hold(r, msg)
			if h != nil || err != nil {
				s.inbox.put(item{r: r, h: h, err: err}, r.stop)
			}
			continue // when the put was cut short, r stopped: see above
		}
		if errors.Is(err, jetstream.ErrNoHeartbeat) && s.gone(r) {
			// A pull on a consumer that no longer exists gets no answer
			// at all: the heartbeats stop.
			err = jetstream.ErrConsumerNotFound
		}
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			notice, ferr := s.reopen(r, err)
			if ferr == nil {
				if notice != nil {
					s.inbox.put(item{r: r, err: notice}, r.stop)
				}
				continue
			}
			err = ferr
		}
		if !s.inbox.put(item{r: r, err: err}, r.stop) {
			continue
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
		if next, err := s.messages(r.consumer()); err == nil {
			r.replace(nil, next)
		}
	}
}

// replace installs r's new iterator (and consumer, when not nil); it
// stops the iterator at once when r was stopped meanwhile.
func (r *reader) replace(cons jetstream.Consumer, it jetstream.MessagesContext) {
	r.itMu.Lock()
	defer r.itMu.Unlock()
	if cons != nil {
		r.cons = cons
	}
	r.it = it
	if r.stopped.Load() {
		it.Stop()
	}
}

// gone reports whether r's consumer no longer exists.
func (s *sub) gone(r *reader) bool {
	ctx, cancel := context.WithTimeout(context.Background(), pullExpiry)
	defer cancel()
	_, err := r.consumer().Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound)
}

// errReopened marks the notice that a deleted consumer was created again.
var errReopened = errors.New("created again at the group's recorded position")

// reopen creates r's consumer again after it was deleted behind the
// group's back (at the group's recorded position; see sub.consumer) and
// starts reading it. Deliveries pulled from the deleted consumer cannot
// be acknowledged any more; the new one delivers them again (a
// partition's reader hands the copies' acknowledgements to the deliveries
// it holds; see sub.hold). It returns a notice for the engine's log (nil
// when r stopped or its lease ran out meanwhile: the lane's next owner
// resets the consumer), or the reason the consumer could not be created
// (the stream is gone, or the group is a throwaway one).
func (s *sub) reopen(r *reader, cause error) (notice, err error) {
	if !r.valid(time.Now()) {
		r.halt(false)
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	cons, err := s.consumer(ctx, r.lane)
	if err != nil {
		if s.pos == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("natsbus: receive %q lane %s: %w: %w", s.topic, r.lane, classify(cause), err)
		}
		// The server may still be removing it: the pump tries again.
		return nil, fmt.Errorf("natsbus: receive %q lane %s: %v; creating it again failed, trying again: %v", s.topic, r.lane, cause, err)
	}
	it, err := s.messages(cons)
	if err != nil {
		return nil, fmt.Errorf("natsbus: receive %q lane %s: consumer created again: %w", s.topic, r.lane, err)
	}
	r.itMu.Lock()
	old := r.it
	r.itMu.Unlock()
	old.Stop()
	r.replace(cons, it)
	return fmt.Errorf("natsbus: receive %q lane %s: consumer %q: %v: %w", s.topic, r.lane, s.consumerName(r.lane), cause, errReopened), nil
}

// halt stops r's iterator. With drain, what it already buffers stays for
// the pump to take (and hand back); without, it is dropped.
func (r *reader) halt(drain bool) {
	if !r.stopped.CompareAndSwap(false, true) {
		return
	}
	close(r.stop)
	r.itMu.Lock()
	defer r.itMu.Unlock()
	if drain {
		r.it.Drain()
	} else {
		r.it.Stop()
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
				s.batch[i] = item{}
				if it.r.stopped.Load() || !it.r.valid(now) {
					continue // of a lane given up
				}
				if it.err != nil {
					if s.failed == nil {
						s.failed = s.readError(it)
					}
					continue
				}
				s.carry = append(s.carry, &it.h.d)
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

// readError is the error a failed read reports to the engine.
func (s *sub) readError(it item) error {
	if errors.Is(it.err, errReopened) {
		return it.err
	}
	err := classify(it.err)
	if errors.Is(err, jetstream.ErrMsgIteratorClosed) && s.c.nc.IsClosed() {
		err = fmt.Errorf("%w: %w", err, driver.ErrClosed)
	}
	if errors.Is(err, driver.ErrNotFound) {
		s.c.forget(s.topic)
	}
	return fmt.Errorf("natsbus: receive %q lane %s: %w", s.topic, it.r.lane, err)
}

// take removes the deliveries from the held set and returns their
// messages, leaving out those of lanes whose lease ran out (the lane's
// next owner reads them again). With ack, it records the highest
// sequence acknowledged per reader; without (Nack), a partition's reader
// expects them back.
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
			switch {
			case ack && !h.r.exclusive:
				h.r.recent[h.r.recentAt] = h.seq
				h.r.recentAt = (h.r.recentAt + 1) % recentAcks
			case ack && h.seq > h.r.acked.Load():
				h.r.acked.Store(h.seq) // under s.mu: no lost update
			case !ack && h.r.exclusive:
				h.r.nacked[h.seq] = struct{}{}
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

// maxHold bounds how long in-progress signals keep a delivery of an
// unpartitioned group from being redelivered (to any member), so that a
// handler that never returns does not hold its message for ever. A
// partition's deliveries are kept in progress as long as the member
// holds them and its lease: letting one go would have it redelivered
// behind newer messages of its lane.
func (s *sub) maxHold() time.Duration { return max(10*s.c.cfg.ackWait, 5*time.Minute) }

// startKeeper starts the goroutine that tells the server that what the
// member holds (pulled and not settled, wherever it waits: in the inbox,
// in carry or in the engine) is still in progress, so that neither a
// backlog nor a slow handler nor a retry waiting in the engine causes
// redeliveries; a delivery is signalled every ack_wait/4 to ack_wait/2.
// For a group that records positions it also records those of the lanes
// the member reads, every recordEvery.
func (s *sub) startKeeper() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		every := max(s.c.cfg.ackWait/4, 50*time.Millisecond)
		t := time.NewTicker(every)
		defer t.Stop()
		recorded := time.Now()
		for {
			select {
			case <-s.closed:
				return
			case now := <-t.C:
				s.signal(now, every)
				if s.pos != nil && now.Sub(recorded) >= recordEvery {
					recorded = now
					ctx, cancel := context.WithTimeout(context.Background(), every)
					s.record(ctx)
					cancel()
				}
			}
		}
	}()
}

// signal sends in-progress signals for the deliveries held longer than
// every since they were pulled or last signalled.
func (s *sub) signal(now time.Time, every time.Duration) {
	var due []jetstream.Msg
	s.mu.Lock()
	for h := range s.held.all() {
		switch {
		case !h.r.valid(now):
			s.held.remove(h) // the lease ran out
		case !h.r.exclusive && now.Sub(h.first) > s.maxHold():
			s.held.remove(h) // let the server redeliver it
		case now.Sub(h.since) >= every:
			h.since = now
			due = append(due, h.msg)
		}
	}
	s.mu.Unlock()
	for _, m := range due {
		_ = m.InProgress()
	}
}

// record raises the group's recorded position of every lane the member
// reads to the sequence after its consumer's ack floor.
func (s *sub) record(ctx context.Context) {
	s.mu.Lock()
	readers := make([]*reader, 0, len(s.readers))
	for _, r := range s.readers {
		readers = append(readers, r)
	}
	s.mu.Unlock()
	for _, r := range readers {
		s.recordLane(ctx, r)
	}
}

// recordLane raises the recorded position of r's lane to the sequence
// after its consumer's ack floor.
func (s *sub) recordLane(ctx context.Context, r *reader) {
	if s.pos == nil || !r.valid(time.Now()) {
		return
	}
	info, err := r.consumer().Info(ctx)
	if err != nil {
		return
	}
	if r.exclusive && info.AckFloor.Consumer > 0 {
		s.mu.Lock()
		r.raiseFloorLocked(info.AckFloor.Stream)
		s.mu.Unlock()
	}
	if next, ok := resumeSeq(info); ok {
		_ = s.pos.raise(ctx, r.lane, next)
	}
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
		if info, err := r.consumer().Info(ctx); err == nil {
			l.Lag, l.Known = int64(info.NumPending)+int64(info.NumAckPending), true
		}
		lags = append(lags, l)
	}
	return lags, nil
}

// Close implements driver.Subscriber: it stops reading and leaves the
// group. A member of an unpartitioned group hands back at once (Nak)
// everything it pulled and the engine did not settle: what the engine
// abandoned, what waits in the inbox, and what the pull iterator still
// buffers, so the group's other members get it now rather than after
// ack_wait. A partitioned member releases its leases instead (see the
// package documentation). The durable consumer (the group's position)
// stays, except for a throwaway group's last member, which deletes it.
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
			r.halt(s.part == nil)
		}
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if s.part != nil {
			s.part.leave(ctx)
		} else {
			s.handBack()
			for _, r := range readers {
				s.recordLane(ctx, r)
			}
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

// handBack naks every delivery the member holds.
func (s *sub) handBack() {
	var msgs []jetstream.Msg
	s.mu.Lock()
	for h := range s.held.all() {
		s.held.remove(h)
		msgs = append(msgs, h.msg)
	}
	s.mu.Unlock()
	for _, m := range msgs {
		_ = m.Nak()
	}
}

package omnibus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Dead-letter headers the engine adds to a message it dead-letters.
const (
	HeaderDeadReason       = "omnibus-dead-reason"
	HeaderDeadAttempts     = "omnibus-dead-attempts"
	HeaderDeadTopic        = "omnibus-dead-topic"
	HeaderDeadGroup        = "omnibus-dead-group"
	HeaderDeadLane         = "omnibus-dead-lane"
	HeaderDeadPosition     = "omnibus-dead-position"
	HeaderDeadFirstFailure = "omnibus-dead-first-failure"
	HeaderDeadLastFailure  = "omnibus-dead-last-failure"
)

// member is one group member: one driver.Subscriber and the engine state
// of the lanes it holds.
//
// Goroutines, all owned by the member and ended by shutdown or close:
//   - fetch: calls Receive while there is room and dispatches deliveries;
//   - settle: sends acknowledgements and commits, coalesced;
//   - workers, which run the slots (a key in OrderKey, a lane in
//     OrderLane, a message in OrderNone) queued in runq, each slot by one
//     worker at a time; started on demand, ended when idle beyond a few;
//   - retry timers, which queue their slot again when they fire.
//
// Lock order: commitMu before mu. mu guards every field below it; no
// driver call and no handler runs while mu is held.
type member struct {
	k  *Consumer
	id int

	sub       driver.Subscriber
	acker     driver.Acker
	nacker    driver.Nacker
	committer driver.Committer

	ctx    context.Context // handlers' parent; cancelled by close
	cancel context.CancelFunc

	fetchCancel context.CancelFunc
	fetchDone   chan struct{}
	settleCh    chan struct{} // wake the settle loop
	settleStop  chan struct{}
	settleDone  chan struct{}
	roomCh      chan struct{} // wake the fetch loop
	wg          sync.WaitGroup
	processed   atomic.Int64

	commitMu sync.Mutex

	mu        sync.Mutex
	started   bool
	draining  bool // shutdown: flush batches at once
	lanes     map[string]*lane
	inflight  int // entries received and not yet released
	waiting   int // of those, entries in slots parked until a retry: not counted against MaxInFlight
	bytes     int
	pending   int // entries held for the watermark (settled or not)
	avgSize   int // moving average of the size of received messages
	acks      []*driver.Delivery
	drained   chan struct{}     // closed when inflight reaches 0 while draining
	epoch     uint64            // counts revocations
	revokedAt map[string]uint64 // lane -> epoch of its last revocation
	receiving chan struct{}     // non-nil while a Receive is outstanding; closed after its dispatch
	fetchIdle bool              // the fetch loop waits for room
	full      bool              // the last Receive returned nothing with messages in flight
	runq      []*slot           // active slots waiting for a worker, from runqHead on
	runqHead  int
	cond      sync.Cond // idle workers wait on it
	idle      int       // idle workers not yet woken
	waking    int       // workers woken or started that have not taken a slot yet
	workers   int       // live workers, at most MaxInFlight
	stopped   bool      // close: workers end
	stopOnce  sync.Once
	stopErr   error // leaving the group failed; set once by stop
}

type lane struct {
	id       string
	settled  *atomic.Int64 // the consumer's count for this lane id
	ctx      context.Context
	cancel   context.CancelFunc
	slots    map[string]*slot   // by key ("" for the whole lane)
	loose    map[*slot]struct{} // OrderNone slots waiting for a retry
	head     *entry             // oldest entry not yet under the watermark
	tail     *entry
	mark     *driver.Delivery // settled watermark not yet committed
	inflight int
	revoking bool
	gone     bool
	idle     chan struct{} // closed when inflight reaches 0 while revoking
	held     int           // entries in the list
}

type slot struct {
	lane    *lane
	key     string
	loose   bool
	queue   []*entry
	running int         // entries at the head of queue being handled
	active  bool        // queued, run by a worker, or waiting for a retry
	parked  bool        // waiting for timer: its entries count in member.waiting
	timer   *time.Timer // pending retry
	wake    chan struct{}
	one     [1]*entry // a loose slot's entry, taken for its worker by dispatch
}

type entry struct {
	d         *driver.Delivery
	msg       Message
	lane      *lane
	size      int
	attempts  int // attempts made by this engine
	base      int // attempts the transport made before this delivery
	settled   bool
	dead      bool // to be dead-lettered: handling is over, publishing it is not
	deadTries int  // dead-letter publishes that failed
	next      *entry
	arrived   time.Time
	firstFail time.Time
	lastFail  time.Time
	err       error // outcome of the last attempt
}

func newMember(k *Consumer, id int) *member {
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{
		k: k, id: id,
		ctx: ctx, cancel: cancel,
		fetchDone:  make(chan struct{}),
		settleCh:   make(chan struct{}, 1),
		settleStop: make(chan struct{}),
		settleDone: make(chan struct{}),
		roomCh:     make(chan struct{}, 1),
		lanes:      map[string]*lane{},
		revokedAt:  map[string]uint64{},
	}
	m.cond.L = &m.mu
	return m
}

// bind attaches the driver's subscriber and finds how it settles.
func (m *member) bind(sub driver.Subscriber) error {
	m.sub = sub
	m.acker, _ = sub.(driver.Acker)
	m.committer, _ = sub.(driver.Committer)
	if m.acker == nil && m.committer == nil {
		return fmt.Errorf("driver %T implements neither Ack nor Commit: %w", sub, ErrUnsupported)
	}
	if m.committer == nil && m.k.cfg.ordering == OrderNone {
		// Native redelivery would reorder, so only unordered consumers use it.
		m.nacker, _ = sub.(driver.Nacker)
	}
	return nil
}

func (m *member) start() {
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return
	}
	m.started = true
	m.mu.Unlock()
	fctx, fcancel := context.WithCancel(m.ctx)
	m.fetchCancel = fcancel
	go m.fetchLoop(fctx)
	go m.settleLoop()
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (m *member) emit(e Event) {
	if fn := m.k.cfg.observer; fn != nil {
		e.Topic, e.Group, e.Member = m.k.topic, m.k.cfg.group, m.id
		fn(e)
	}
}

// --- fetching and dispatch ---

// holdFactor bounds the entries a member holds, settled or not, at
// holdFactor x MaxInFlight: entries parked behind a retry and entries kept
// only for a lane's watermark do not count against MaxInFlight, so that
// one failing key does not stop the others, but they cannot grow without
// bound either.
const holdFactor = 16

// room is what the fetch loop may ask Receive for now: the bounds on
// messages and bytes in flight less what is held. Entries parked until a
// retry count against the bytes and the hold bound, not against
// MaxInFlight. Once messages are active it waits until a quarter of the
// bound is free (judged at the average size received so far), so that
// Receive returns batches rather than one message per settlement.
func (m *member) room() driver.Room {
	cfg := &m.k.cfg
	hold := holdFactor * cfg.maxInFlight
	if m.full || m.bytes >= cfg.maxBytes || m.inflight >= hold || m.pending >= hold {
		return driver.Room{}
	}
	active := m.inflight - m.waiting
	r := driver.Room{
		Count:    min(cfg.maxInFlight-active, hold-m.inflight, hold-m.pending),
		Bytes:    cfg.maxBytes - m.bytes,
		Oversize: m.inflight == 0,
	}
	if r.Count <= 0 {
		return driver.Room{}
	}
	if active > 0 && m.avgSize > 0 {
		limit := max(1, min(cfg.maxInFlight, cfg.maxBytes/m.avgSize))
		if min(r.Count, r.Bytes/m.avgSize) < max(1, limit/4) {
			return driver.Room{}
		}
	}
	return r
}

// fullWait is how long the fetch loop waits before asking again after a
// Receive that returned nothing while messages were in flight (the first
// message waiting may not fit), unless a settlement wakes it first.
const fullWait = 50 * time.Millisecond

func (m *member) fetchLoop(ctx context.Context) {
	defer close(m.fetchDone)
	failures := 0
	for {
		m.mu.Lock()
		room := m.room()
		epoch := m.epoch
		var received chan struct{}
		if room.Count > 0 {
			received = make(chan struct{})
			m.receiving = received
		}
		m.fetchIdle = room.Count <= 0
		full := m.full
		m.mu.Unlock()
		if room.Count <= 0 {
			var retry *time.Timer
			var expired <-chan time.Time
			if full {
				retry = time.NewTimer(fullWait)
				expired = retry.C
			}
			select {
			case <-m.roomCh:
			case <-expired:
			case <-ctx.Done():
				return
			}
			if retry != nil {
				retry.Stop()
			}
			m.mu.Lock()
			m.full = false
			m.mu.Unlock()
			continue
		}
		ds, err := m.sub.Receive(ctx, room)
		if err != nil {
			m.mu.Lock()
			m.receiving = nil
			m.mu.Unlock()
			close(received)
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			if errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnsupported) || errors.Is(err, ErrInvalid) {
				m.k.fail(fmt.Errorf("omnibus: receive %q: %w", m.k.topic, err))
				return
			}
			failures++
			delay := m.k.cfg.backoff(failures, rand.Float64)
			m.k.logger.Warn("omnibus: receive failed, retrying", "member", m.id, "err", err, "delay", delay)
			select {
			case <-time.After(delay):
				continue
			case <-ctx.Done():
				return
			}
		}
		failures = 0
		now := time.Now()
		m.mu.Lock()
		for _, d := range ds {
			// A Receive that outlived a revocation's wait for it may hold
			// deliveries of the old claim: the lane's next owner reads
			// them again.
			if m.revokedAt[d.Lane] <= epoch {
				m.dispatchLocked(d, now)
			}
		}
		m.full = len(ds) == 0 && m.inflight > 0
		m.receiving = nil
		m.mu.Unlock()
		close(received)
	}
}

func (m *member) laneLocked(id string) *lane {
	l := m.lanes[id]
	if l == nil {
		ctx, cancel := context.WithCancel(m.ctx)
		l = &lane{id: id, ctx: ctx, cancel: cancel, slots: map[string]*slot{}, loose: map[*slot]struct{}{}, settled: m.k.laneCounter(id)}
		m.lanes[id] = l
	}
	return l
}

func (m *member) dispatchLocked(d *driver.Delivery, now time.Time) {
	l := m.laneLocked(d.Lane)
	if l.gone || l.revoking {
		return // the lane is going away; its next owner reads it again
	}
	// An unordered message without batching gets a slot of its own,
	// allocated with its entry, already holding it: its worker starts
	// without taking the lock again.
	loose := m.k.cfg.ordering == OrderNone && m.k.batch == nil
	var e *entry
	var s *slot
	if loose {
		p := new(struct {
			s slot
			e entry
		})
		s, e = &p.s, &p.e
		*s = slot{lane: l, loose: true, running: 1, one: [1]*entry{e}}
		s.queue = s.one[:]
	} else {
		e = new(entry)
	}
	e.d, e.lane, e.arrived = d, l, now
	if d.Attempt > 1 {
		e.base = d.Attempt - 1
	}
	fromDelivery(&e.msg, m.k.topic, d)
	e.size = d.Size()
	l.inflight++
	m.inflight++
	m.bytes += e.size
	if m.avgSize == 0 {
		m.avgSize = max(1, e.size)
	} else {
		m.avgSize = max(1, (7*m.avgSize+e.size)/8)
	}
	if m.committer != nil {
		if l.tail == nil {
			l.head = e
		} else {
			l.tail.next = e
		}
		l.tail = e
		l.held++
		m.pending++
	}
	switch {
	case loose:
	case m.k.cfg.ordering == OrderKey:
		s = l.slotLocked(d.Key)
		s.queue = append(s.queue, e)
	default:
		s = l.slotLocked("")
		s.queue = append(s.queue, e)
	}
	switch {
	case !s.active:
		s.active = true
		m.startLocked(s)
	case s.parked:
		m.waiting++
	case s.wake != nil:
		signal(s.wake)
	}
}

func (l *lane) slotLocked(key string) *slot {
	s := l.slots[key]
	if s == nil {
		s = &slot{lane: l, key: key}
		l.slots[key] = s
	}
	return s
}

func (l *lane) dropSlotLocked(s *slot) {
	if s.loose {
		delete(l.loose, s)
	} else if l.slots[s.key] == s {
		delete(l.slots, s.key)
	}
}

// --- running handlers ---

// startLocked queues the active slot s for a worker.
//
// Workers start on demand and outlive their slots: a worker that takes a
// slot and leaves more queued wakes (or starts) one more, so the pool grows
// with the backlog, up to MaxInFlight workers (the bound on handlers
// running at once), and a steady flow costs no goroutine (nor a hand-off)
// per message. An idle worker waits while fewer than maxIdle others do,
// and ends otherwise.
func (m *member) startLocked(s *slot) {
	m.runq = append(m.runq, s)
	if m.waking == 0 {
		m.wakeLocked()
	}
}

// wakeLocked wakes an idle worker, or starts one unless MaxInFlight are
// running: then one of them takes the queue's next slot when it is done.
func (m *member) wakeLocked() {
	if m.idle > 0 {
		m.waking++
		m.idle--
		m.cond.Signal()
		return
	}
	if m.workers >= m.k.cfg.maxInFlight {
		return
	}
	m.waking++
	m.workers++
	m.wg.Add(1)
	go m.worker()
}

func (m *member) worker() {
	defer m.wg.Done()
	id := m.k.own.enter()
	defer m.k.own.leave(id)
	maxIdle := max(4, runtime.GOMAXPROCS(0))
	m.mu.Lock()
	defer m.mu.Unlock()
	defer func() { m.workers-- }()
	m.waking--
	for !m.stopped {
		if m.runqHead == len(m.runq) {
			if m.idle >= maxIdle {
				return
			}
			m.idle++
			m.cond.Wait() // wakeLocked counted it out of idle
			m.waking--
			continue
		}
		s := m.runq[m.runqHead]
		m.runq[m.runqHead] = nil
		if m.runqHead++; m.runqHead == len(m.runq) {
			m.runq, m.runqHead = m.runq[:0], 0
		} else if m.waking == 0 {
			m.wakeLocked()
		}
		m.mu.Unlock()
		m.run(s)
		m.mu.Lock()
	}
}

// run handles s's queue in order until the queue is empty or a retry has
// to wait. A loose slot (OrderNone) arrives with its one entry already
// taken for it by dispatch.
func (m *member) run(s *slot) {
	ready := s.loose && s.running == 1
	for {
		var batch []*entry
		var wait time.Duration
		if ready {
			batch, ready = s.one[:], false
		} else {
			batch, wait = m.take(s)
		}
		if wait > 0 {
			if !m.waitBatch(s, wait) {
				return
			}
			continue
		}
		if batch == nil {
			return
		}
		var latency time.Duration
		if !batch[0].dead { // a dead letter waiting to land is only published
			latency = m.invoke(s.lane.ctx, batch)
		}
		if !m.settle(s, batch, latency) {
			return
		}
	}
}

// take returns the next batch of s to handle, or a time to wait for more
// messages, or nil when the slot is done (it then releases s). A dead
// letter waiting to land makes a batch of its own.
func (m *member) take(s *slot) ([]*entry, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := s.lane
	if len(s.queue) == 0 || l.gone || m.ctx.Err() != nil {
		s.active = false
		l.dropSlotLocked(s)
		return nil, 0
	}
	n := 1
	if m.k.batch != nil && !s.queue[0].dead {
		cfg := &m.k.cfg
		bytes := s.queue[0].size
		for n < len(s.queue) && n < cfg.batchCount && !s.queue[n].dead && bytes+s.queue[n].size <= cfg.batchBytes {
			bytes += s.queue[n].size
			n++
		}
		full := n == cfg.batchCount || n < len(s.queue)
		if age := time.Since(s.queue[0].arrived); !full && !m.draining && age < cfg.batchPeriod {
			if s.wake == nil {
				s.wake = make(chan struct{}, 1)
			}
			return nil, cfg.batchPeriod - age
		}
	}
	s.running = n
	return s.queue[:n:n], 0
}

// waitBatch waits for a batch to fill; false when the member is closing.
func (m *member) waitBatch(s *slot, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.wake:
	case <-s.lane.ctx.Done():
		return false
	}
	return true
}

// invoke runs the handler on batch and leaves each entry's outcome in
// its err.
func (m *member) invoke(ctx context.Context, batch []*entry) (latency time.Duration) {
	for _, e := range batch {
		e.attempts++
		e.msg.Attempt = e.base + e.attempts
		e.err = nil
	}
	var start time.Time
	if m.k.cfg.observer != nil { // only events report it
		start = time.Now()
	}
	defer func() {
		if !start.IsZero() {
			latency = time.Since(start)
		}
		if r := recover(); r != nil {
			m.k.logger.Error("omnibus: handler panicked", "panic", r, "stack", string(debug.Stack()))
			err := fmt.Errorf("handler panic: %v", r)
			for _, e := range batch {
				e.err = err
			}
		}
	}()
	if m.k.handler != nil {
		batch[0].err = m.k.handler(ctx, &batch[0].msg)
		return 0
	}
	msgs := make([]*Message, len(batch))
	for i, e := range batch {
		msgs[i] = &e.msg
	}
	err := m.k.batch(ctx, msgs)
	var be *BatchError
	each := errors.As(err, &be) && len(be.Errs) == len(batch)
	for i, e := range batch {
		if each {
			e.err = be.Errs[i]
		} else {
			e.err = err
		}
	}
	return 0
}

// settle applies the outcomes of a handled batch. It returns false when
// the worker must leave s (a retry timer or nothing owns the slot now).
//
// Events are collected and emitted once m.mu is released: an observer may
// call back into the consumer.
func (m *member) settle(s *slot, batch []*entry, latency time.Duration) bool {
	cfg := &m.k.cfg
	l := s.lane
	var failed, dead []*entry
	for _, e := range batch {
		switch {
		case e.dead:
			dead = append(dead, e)
		case e.err == nil:
			m.emit(Event{Kind: EventProcessed, Lane: e.d.Lane, Message: &e.msg, Latency: latency})
		default:
			now := time.Now()
			if e.firstFail.IsZero() {
				e.firstFail = now
			}
			e.lastFail = now
			m.emit(Event{Kind: EventFailed, Lane: e.d.Lane, Message: &e.msg, Err: e.err, Latency: latency})
			if IsPermanent(e.err) || e.base+e.attempts >= cfg.maxAttempts {
				e.dead = true
				dead = append(dead, e)
			} else {
				failed = append(failed, e)
			}
		}
	}
	// Dead letters are published before they are settled: a message is
	// never settled without landing somewhere. One that did not land
	// stays at the head of its slot and is published again after a
	// backoff; the slot's other messages wait behind it, other slots run.
	var parked []*entry
	for _, e := range dead {
		if err := m.deadLetter(l.ctx, e); err != nil {
			parked = append(parked, e)
		}
	}
	var nacked []*entry
	if len(failed) > 0 && m.nacker != nil && failed[0].d.Attempt > 0 {
		nacked = m.nack(failed)
		if nacked != nil {
			failed = nil
		}
	}

	var retried []Event
	m.mu.Lock()
	var keep []*entry
	for _, e := range batch {
		switch {
		case contains(failed, e) || contains(parked, e):
			keep = append(keep, e)
		case contains(nacked, e):
			m.forgetLocked(e)
		default:
			m.ackLocked(e)
		}
	}
	// The handled batch leaves the queue; entries to retry go back to its
	// head in their order, in place.
	n, k := len(batch), len(keep)
	clear(s.queue[:n-k])
	copy(s.queue[n-k:n], keep)
	s.queue = s.queue[n-k:]
	s.running = 0
	switch {
	case k == 0 && s.loose: // its one message is done: no need to look again
		s.active = false
		l.dropSlotLocked(s)
		m.mu.Unlock()
		return false
	case k == 0:
		m.mu.Unlock()
		return true
	case l.gone || m.ctx.Err() != nil:
		// Not retried here: release the slot's work to the transport.
		for _, e := range s.queue {
			m.forgetLocked(e)
		}
		s.queue = nil
		m.mu.Unlock()
		return true
	}
	var delay time.Duration
	if keep[0].dead {
		delay = cfg.backoff(keep[0].deadTries, rand.Float64)
	} else {
		delay = cfg.backoff(keep[0].attempts, rand.Float64)
	}
	for _, e := range keep {
		if !e.dead {
			retried = append(retried, Event{Kind: EventRetried, Lane: e.d.Lane, Message: &e.msg, Delay: delay})
		}
	}
	if s.loose {
		l.loose[s] = struct{}{} // for a revocation to find it
	}
	m.parkLocked(s, delay)
	m.mu.Unlock()
	for _, e := range retried {
		m.emit(e)
	}
	return false
}

// parkLocked queues s again after delay. Meanwhile its entries count as
// waiting, not against MaxInFlight, so the fetch loop goes on for the
// other slots.
func (m *member) parkLocked(s *slot, delay time.Duration) {
	s.parked = true
	m.waiting += len(s.queue)
	m.wakeFetchLocked()
	m.wg.Add(1)
	s.timer = time.AfterFunc(delay, func() {
		defer m.wg.Done()
		m.mu.Lock()
		s.timer = nil
		m.unparkLocked(s)
		m.startLocked(s)
		m.mu.Unlock()
	})
}

func (m *member) unparkLocked(s *slot) {
	if s.parked {
		s.parked = false
		m.waiting -= len(s.queue)
	}
}

func contains(es []*entry, e *entry) bool {
	for _, x := range es {
		if x == e {
			return true
		}
	}
	return false
}

// nack hands failed entries back to the transport for delayed redelivery.
func (m *member) nack(failed []*entry) []*entry {
	ds := make([]*driver.Delivery, len(failed))
	for i, e := range failed {
		ds[i] = e.d
	}
	delay := m.k.cfg.backoff(failed[0].base+failed[0].attempts, rand.Float64)
	if err := m.nacker.Nack(m.ctx, ds, delay); err != nil {
		m.k.logger.Warn("omnibus: nack failed; retrying in the engine", "err", err)
		return nil
	}
	for _, e := range failed {
		m.emit(Event{Kind: EventRetried, Lane: e.d.Lane, Message: &e.msg, Delay: delay})
	}
	return failed
}

// deadLetter publishes e to the dead-letter topic, once, under the lane's
// context: a lane that moved to another member stops dead-lettering here.
// A failure is logged with what it means; the caller parks e and tries
// again after a backoff. A dead letter the topic refuses for good
// (too large even with its reason trimmed, an invalid or missing topic, no
// permission) is tried again all the same, at most every BackoffMax: the
// refusal may be fixed (a topic created, a permission granted), and
// settling the message without it landing would lose it.
func (m *member) deadLetter(ctx context.Context, e *entry) error {
	cfg := &m.k.cfg
	dm := m.deadMessage(e)
	err := m.k.client.publish(ctx, cfg.deadLetter, []*driver.Message{dm}, driver.PublishOptions{Durability: DurabilityAll, DeadLetter: true})
	if err == nil {
		m.emit(Event{Kind: EventDeadLettered, Lane: e.d.Lane, Message: &e.msg, Err: e.err})
		return nil
	}
	if ctx.Err() != nil {
		return err // the lane is going: its next owner handles the message
	}
	e.deadTries++
	refused := !errors.Is(err, ErrRetryable) && (errors.Is(err, ErrTooLarge) || errors.Is(err, ErrInvalid) ||
		errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnsupported))
	m.k.logger.Error("omnibus: dead letter not published; it holds its key and is tried again",
		"dlq", cfg.deadLetter, "id", e.msg.ID, "lane", e.d.Lane, "tries", e.deadTries, "refused", refused, "err", err)
	m.emit(Event{Kind: EventDeadLetterFailed, Lane: e.d.Lane, Message: &e.msg, Err: err})
	return err
}

// deadMessage is e as a dead letter: the message with headers saying why.
// When the transport has a size limit and the reason pushes the message
// over it, the reason is cut to fit.
func (m *member) deadMessage(e *entry) *driver.Message {
	cfg := &m.k.cfg
	h := make(map[string]string, len(e.msg.Headers)+8)
	for k, v := range e.msg.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = e.err.Error()
	h[HeaderDeadAttempts] = strconv.Itoa(e.base + e.attempts)
	h[HeaderDeadTopic] = m.k.topic
	h[HeaderDeadGroup] = cfg.group
	h[HeaderDeadLane] = e.d.Lane
	h[HeaderDeadPosition] = e.d.Position
	h[HeaderDeadFirstFailure] = e.firstFail.UTC().Format(time.RFC3339Nano)
	h[HeaderDeadLastFailure] = e.lastFail.UTC().Format(time.RFC3339Nano)
	dm := &driver.Message{ID: e.msg.ID, Key: e.msg.Key, Type: e.msg.Type, Source: e.msg.Source, Time: e.msg.Time, Headers: h, Body: e.msg.Body}
	if limit := m.k.client.caps.MaxMessageBytes; limit > 0 {
		if over := dm.Size() - limit; over > 0 {
			reason := h[HeaderDeadReason]
			h[HeaderDeadReason] = strings.ToValidUTF8(reason[:max(0, len(reason)-over)], "")
		}
	}
	return dm
}

// --- settlement ---

// forgetLocked drops e from the in-flight accounting. Settled or not, the
// engine is done with it; an unsettled one is delivered again later.
func (m *member) forgetLocked(e *entry) {
	l := e.lane
	l.inflight--
	m.inflight--
	m.bytes -= e.size
	e.msg.Body, e.d.Body = nil, nil
	m.full = false
	m.wakeFetchLocked()
	if l.idle != nil && l.inflight == 0 {
		close(l.idle)
		l.idle = nil
	}
	if m.drained != nil && m.inflight == 0 {
		close(m.drained)
		m.drained = nil
	}
}

// wakeFetchLocked wakes the fetch loop when it waits and there is room.
func (m *member) wakeFetchLocked() {
	if m.fetchIdle && m.room().Count > 0 {
		m.fetchIdle = false
		signal(m.roomCh)
	}
}

// ackLocked settles e.
func (m *member) ackLocked(e *entry) {
	m.forgetLocked(e)
	l := e.lane
	if l.gone {
		return
	}
	m.processed.Add(1)
	if m.committer == nil {
		l.settled.Add(1)
		m.acks = append(m.acks, e.d)
		if len(m.acks) == 1 { // the settle loop takes them all at once
			signal(m.settleCh)
		}
		return
	}
	e.settled = true
	advanced := false
	for l.head != nil && l.head.settled {
		l.settled.Add(1)
		l.mark = l.head.d
		l.head = l.head.next
		l.held--
		m.pending--
		advanced = true
	}
	if l.head == nil {
		l.tail = nil
	}
	if advanced {
		m.wakeFetchLocked() // the watermark bound may have held it
		signal(m.settleCh)
	}
}

// settleLoop sends acknowledgements as they come, coalesced, and commits
// positions at most once per CommitInterval: acknowledgements free the
// transport's prefetch window, commits only bound redelivery after a crash.
func (m *member) settleLoop() {
	defer close(m.settleDone)
	id := m.k.own.enter() // it runs observers
	defer m.k.own.leave(id)
	for {
		select {
		case <-m.settleCh:
			_ = m.flush(m.ctx, nil)
		case <-m.settleStop:
			return
		}
		if m.committer == nil {
			continue
		}
		t := time.NewTimer(m.k.cfg.commitInterval)
		select {
		case <-t.C:
		case <-m.settleStop:
			t.Stop()
			return
		}
	}
}

// flush sends pending acknowledgements and commits the watermark of the
// given lanes (all lanes when nil); it returns the commit's error. Lanes
// already gone are never committed: commitMu keeps a revocation from
// overtaking a flush. Failures are logged; a failed commit is tried again
// with the next flush. Events are emitted after commitMu is released.
func (m *member) flush(ctx context.Context, only []*lane) error {
	events, err := m.flushLocked(ctx, only)
	for _, e := range events {
		m.emit(e)
	}
	return err
}

func (m *member) flushLocked(ctx context.Context, only []*lane) ([]Event, error) {
	m.commitMu.Lock()
	defer m.commitMu.Unlock()
	m.mu.Lock()
	acks := m.acks
	m.acks = nil
	var marks []*driver.Delivery
	var lanes []string
	collect := func(l *lane) {
		if l.mark != nil && !l.gone {
			marks = append(marks, l.mark)
			lanes = append(lanes, l.id)
			l.mark = nil
		}
	}
	if only != nil {
		for _, l := range only {
			collect(l)
		}
	} else {
		for _, l := range m.lanes {
			collect(l)
		}
	}
	m.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, m.k.cfg.commitTimeout)
	defer cancel()
	var events []Event
	var errs []error
	if len(acks) > 0 {
		if err := m.acker.Ack(ctx, acks); err != nil {
			m.k.logger.Warn("omnibus: ack failed; the transport will redeliver", "member", m.id, "count", len(acks), "err", err)
			errs = append(errs, fmt.Errorf("omnibus: ack %d message(s) of %q: %w", len(acks), m.k.topic, err))
		} else {
			events = append(events, Event{Kind: EventCommitted, Count: len(acks)})
		}
	}
	if len(marks) > 0 {
		if err := m.committer.Commit(ctx, marks); err != nil {
			m.k.logger.Warn("omnibus: commit failed; will retry with the next", "member", m.id, "lanes", lanes, "err", err)
			errs = append(errs, fmt.Errorf("omnibus: commit %q lanes %v: %w", m.k.topic, lanes, err))
			m.mu.Lock()
			for i, d := range marks {
				if l := m.lanes[lanes[i]]; l != nil && l.mark == nil && !l.gone {
					l.mark = d
				}
			}
			m.mu.Unlock()
		} else {
			events = append(events, Event{Kind: EventCommitted, Lanes: lanes, Count: len(marks)})
		}
	}
	return events, errors.Join(errs...)
}

// --- lanes (driver.Lanes) ---

// Claimed implements driver.Lanes.
func (m *member) Claimed(ids []string) {
	id := m.k.own.enter()
	defer m.k.own.leave(id)
	m.mu.Lock()
	for _, id := range ids {
		if l := m.lanes[id]; l != nil && (l.gone || l.revoking) {
			delete(m.lanes, id)
		}
		m.laneLocked(id)
	}
	m.mu.Unlock()
	m.emit(Event{Kind: EventClaimed, Lanes: ids})
}

// Revoked implements driver.Lanes. It waits for a Receive in progress to
// return and be dispatched (so nothing of the old claim arrives later),
// lets the lanes' work finish within DrainTimeout (retries included),
// commits what is settled, and lets the lanes go. Meanwhile the fetch
// loop goes on for the lanes that stay, and drops what arrives for these.
func (m *member) Revoked(ctx context.Context, ids []string) {
	own := m.k.own.enter()
	defer m.k.own.leave(own)
	// One bound for the whole drain: the wait for Receive and for the
	// lanes' work share it.
	drain, cancel := context.WithTimeout(ctx, m.k.cfg.drainTimeout)
	defer cancel()
	m.awaitReceive(drain)

	m.mu.Lock()
	var lanes []*lane
	var idle []chan struct{}
	for _, id := range ids {
		l := m.lanes[id]
		if l == nil || l.gone || l.revoking {
			continue
		}
		m.revokeLocked(l)
		if l.inflight > 0 {
			l.idle = make(chan struct{})
			idle = append(idle, l.idle)
		}
		lanes = append(lanes, l)
	}
	m.mu.Unlock()
wait:
	for _, ch := range idle {
		select {
		case <-ch:
		case <-drain.Done():
			break wait
		}
	}
	_ = m.flush(ctx, lanes)
	m.mu.Lock()
	for _, l := range lanes {
		m.goneLocked(l)
	}
	m.mu.Unlock()
	m.emit(Event{Kind: EventRevoked, Lanes: ids})
}

// Lost implements driver.Lanes: abandon the lanes without committing. It
// may come while a Revoked of other lanes drains.
func (m *member) Lost(ids []string) {
	own := m.k.own.enter()
	defer m.k.own.leave(own)
	wait, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	m.awaitReceive(wait)
	m.mu.Lock()
	for _, id := range ids {
		if l := m.lanes[id]; l != nil {
			m.revokeLocked(l)
			m.goneLocked(l)
		}
	}
	m.mu.Unlock()
	m.emit(Event{Kind: EventLost, Lanes: ids})
}

// awaitReceive waits, at most until ctx ends, for an outstanding Receive
// to return and its deliveries to be dispatched. Drivers make Receive
// return promptly when they revoke.
func (m *member) awaitReceive(ctx context.Context) {
	m.mu.Lock()
	received := m.receiving
	m.mu.Unlock()
	if received != nil {
		select {
		case <-received:
		case <-ctx.Done():
		}
	}
}

// revokeLocked marks l as going away: deliveries of it still to come
// (from a Receive that started earlier, or while it drains) are dropped.
func (m *member) revokeLocked(l *lane) {
	l.revoking = true
	m.epoch++
	m.revokedAt[l.id] = m.epoch
}

// goneLocked detaches l: results still running on it are discarded.
func (m *member) goneLocked(l *lane) {
	m.dropQueuedLocked(l)
	l.gone = true
	l.cancel()
	m.pending -= l.held
	l.held = 0
	l.head, l.tail, l.mark = nil, nil, nil
	if l.idle != nil { // a Revoked of l waits for it
		close(l.idle)
		l.idle = nil
	}
	if m.lanes[l.id] == l {
		delete(m.lanes, l.id)
	}
	m.wakeFetchLocked()
}

// dropQueuedLocked releases every entry of l that is not running: queued
// behind a running one, waiting for a batch, or waiting for a retry.
func (m *member) dropQueuedLocked(l *lane) {
	drop := func(s *slot) {
		m.unparkLocked(s)
		for _, e := range s.queue[s.running:] {
			m.forgetLocked(e)
		}
		clear(s.queue[s.running:])
		s.queue = s.queue[:s.running]
		if s.timer != nil && s.timer.Stop() {
			s.timer = nil
			s.active = false
			l.dropSlotLocked(s)
			m.wg.Done() // the timer will not fire
		}
		if s.wake != nil {
			signal(s.wake)
		}
	}
	for _, s := range l.slots {
		drop(s)
	}
	for s := range l.loose {
		drop(s)
	}
}

// --- stopping ---

// shutdown drains the member: it stops fetching, waits until ctx ends for
// what it holds to be settled, commits, and stops. It returns the number
// of messages left unsettled when ctx ended first, and the final commit's
// error. A handler that ignores its context does not hold it past ctx:
// the member stops without waiting for it (see stop).
func (m *member) shutdown(ctx context.Context) (int, error) {
	m.stopFetching()
	m.mu.Lock()
	m.draining = true
	for _, l := range m.lanes {
		for _, s := range l.slots {
			if s.wake != nil {
				signal(s.wake) // flush a batch waiting to fill
			}
		}
	}
	var drained chan struct{}
	if m.inflight > 0 {
		m.drained = make(chan struct{})
		drained = m.drained
	}
	m.mu.Unlock()
	left := 0
	if drained != nil {
		select {
		case <-drained:
		case <-ctx.Done():
			m.mu.Lock()
			left = m.inflight
			m.mu.Unlock()
		}
	}
	fctx := ctx
	if ctx.Err() != nil {
		// Committing what is settled is worth a short grace.
		var cancel context.CancelFunc
		fctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
	}
	err := m.flush(fctx, nil)
	if left > 0 {
		return left, errors.Join(err, m.stop())
	}
	return 0, errors.Join(err, m.close())
}

func (m *member) stopFetching() {
	m.mu.Lock()
	started := m.started
	m.mu.Unlock()
	if !started {
		return
	}
	m.fetchCancel()
	<-m.fetchDone
}

// close stops everything at once and waits for the member's goroutines.
// It returns the error of leaving the group.
func (m *member) close() error {
	err := m.stop()
	m.wg.Wait()
	return err
}

// stop stops the member at once without waiting for its workers: a
// handler still running finds its lane gone when it returns, and its
// worker ends then. It returns the error of leaving the group.
func (m *member) stop() error {
	m.stopOnce.Do(func() {
		m.stopFetching()
		m.cancel()
		m.mu.Lock()
		m.stopped = true
		m.cond.Broadcast()
		for _, l := range m.lanes {
			m.revokeLocked(l)
			m.goneLocked(l)
		}
		started := m.started
		m.mu.Unlock()
		if started {
			close(m.settleStop)
			<-m.settleDone
		}
		// Leaving the group may call Revoked; it finds the lanes gone.
		if err := m.sub.Close(); err != nil {
			m.k.logger.Warn("omnibus: leaving the group failed", "member", m.id, "err", err)
			m.stopErr = fmt.Errorf("omnibus: leave group %q of %q: %w", m.k.cfg.group, m.k.topic, err)
		}
	})
	return m.stopErr
}

package omnibus

// The consumer engine, one group member at a time. This file holds the
// member's state (member, lane, slot, entry), its start and its stop; the
// other rooms are:
//
//	fetch.go      the fetch loop: room, Receive, dispatch into slots
//	worker.go     the run queue and the workers that run slots' handlers
//	retry.go      handlers' outcomes: acks, retries, dead letters
//	watermark.go  settlement: in-flight accounting, the watermark, the settle loop
//	revoke.go     lane claims, revocations and losses (driver.Lanes)
//	own.go        calls from inside: Close, Shutdown, Scale from a callback
//
// Lock order: Consumer.mu before member.commitMu before member.mu. mu
// guards the member's, lanes' and slots' fields; no driver call, handler
// or observer runs while it is held.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus/driver"
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
	keeper    driver.AttemptKeeper
	counter   driver.RunCounter // nil where keeper is set
	waker     driver.Waker      // nil when the driver has no way to end a Receive early

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
	marking   int               // revocations and losses between their wait for Receive and their lanes' marking
	marked    chan struct{}     // closed when marking falls to 0
	fetchIdle bool              // the fetch loop waits for room
	full      bool              // the last Receive returned nothing with messages in flight
	laneGen   uint64            // counts lane claims, revocations and losses
	runq      []*slot           // active slots waiting for a worker, from runqHead on
	runqHead  int
	cond      sync.Cond // idle workers wait on it
	idle      int       // idle workers not yet woken
	waking    int       // workers woken or started that have not taken a slot yet
	workers   int       // live workers, at most MaxInFlight
	stopped   bool      // close: workers end
	stopOnce  sync.Once
	stopErr   error         // leaving the group failed; set once by stop
	guardTurn chan struct{} // held by the one suspect running (see guard.go)
	suspects  int           // suspects held
	forgiving bool          // a suspect was found exhausted: the others held with it run
}

type lane struct {
	id       string
	settled  *atomic.Int64 // the consumer's count for this lane id
	ctx      context.Context
	cancel   context.CancelFunc
	slots    map[string]*slot   // by key ("" for the whole lane)
	loose    map[*slot]struct{} // OrderNone slots waiting for a retry
	guard    *slot              // the lane's messages one at a time, while guarded (see guard.go)
	guarding int                // deliveries still to go to guard
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
	guarded bool // the lane's guard slot
	queue   []*entry
	running int         // entries at the head of queue being handled
	active  bool        // queued, run by a worker, or waiting for a retry
	parked  bool        // waiting for timer: its entries count in member.waiting
	timer   *time.Timer // pending retry
	wake    chan struct{}
	one     [1]*entry // the queue's first room, so a new slot allocates none
}

type entry struct {
	d         *driver.Delivery
	msg       Message
	lane      *lane
	size      int
	attempts  int  // attempts made by this engine
	base      int  // attempts the transport made before this delivery
	begun     bool // the transport counted this holder's attempt (see guard.go)
	suspect   bool // a previous holder may have died running it (see guard.go)
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
	ctx, cancel := context.WithCancel(k.values)
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
		guardTurn:  make(chan struct{}, 1),
	}
	m.cond.L = &m.mu
	return m
}

// bind attaches the driver's subscriber and finds how it settles.
func (m *member) bind(sub driver.Subscriber) error {
	m.sub = sub
	m.acker, _ = sub.(driver.Acker)
	m.committer, _ = sub.(driver.Committer)
	if m.keeper, _ = sub.(driver.AttemptKeeper); m.keeper == nil {
		m.counter, _ = sub.(driver.RunCounter)
	}
	m.waker, _ = sub.(driver.Waker)
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

// emit hands e to the hooks of its kind; without hooks of any event kind
// it costs a branch.
func (m *member) emit(e Event) {
	if !m.k.hooks.events {
		return
	}
	e.Topic, e.Group, e.Member = m.k.topic, m.k.cfg.group, m.id
	m.k.hooks.event(e)
}

// shutdown drains the member: it stops fetching, waits until ctx ends for
// what it holds to be settled, commits, and stops. It returns the number
// of messages left unsettled when ctx ended first, and the final commit's
// error. A handler that ignores its context does not hold it past ctx:
// the member stops without waiting for it (see stop).
func (m *member) shutdown(ctx context.Context) (int, error) {
	m.stopFetching()
	m.mu.Lock()
	m.draining = true
	m.wakeBatchesLocked()
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
			m.k.logger.Warn("leaving the group failed", "member", m.id, "err", err)
			m.stopErr = fmt.Errorf("omnibus: leave group %q of %q: %w", m.k.cfg.group, m.k.topic, err)
		}
	})
	return m.stopErr
}

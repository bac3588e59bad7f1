package dlq

// The reader: one member of the dead-letter topic's own group, driven
// through the transport's driver rather than the engine. A browse must
// hold any number of messages unsettled, settle a chosen few, and never
// retry or dead-letter anything; the engine would run a handler (and a
// goroutine) per held message and its failure paths are what a browse
// must not take. Deliveries are received on the fetch goroutine (one
// Receive at a time, as the engine calls it) and used on the caller's;
// the driver's Lanes callbacks run on the driver's goroutines.
//
// Locks: work is held by the caller while it publishes and settles a
// batch, and by Revoked, so a revocation waits for a batch in progress
// (whose settlement it must not overtake); mu guards the lanes and
// entries. Order: work, mu. No driver call runs under mu.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// session is one reading of the dead-letter topic.
type session struct {
	topic     string
	sub       driver.Subscriber
	acker     driver.Acker     // brokers: settled messages are acknowledged
	committer driver.Committer // logs: the settled prefix of a lane is committed
	ordered   bool             // lanes are settled in order (see settle)
	lag       func(ctx context.Context) ([]driver.LaneLag, error)
	// timeLag reads the group's lag in time, where the transport's lag is
	// a time (Kinesis): before the first delivery, a lane whose records
	// wait keeps the read going (see drained).
	timeLag   func(ctx context.Context) ([]driver.LaneLag, error)
	republish func(ctx context.Context, ds []*driver.Delivery) ([]string, error) // appends copies to the topic
	window    int                                                                // most deliveries held
	bytes     int                                                                // most bytes (Message.Size) held
	idle      time.Duration                                                      // quiet time after which an unknown lag means drained
	wait      time.Duration                                                      // quiet time after which the read ends whatever the lag says

	want   chan driver.Room
	got    chan fetched
	cancel context.CancelFunc
	done   chan struct{}

	// The caller's: whether a Room is out, when the last delivery came,
	// whether any came.
	asked    bool
	last     time.Time
	received bool

	work    sync.Mutex
	mu      sync.Mutex
	lanes   map[string]*laneHeld
	entries map[*driver.Delivery]*entry
	held    int             // entries in lanes
	size    int             // their Message.Size, as received
	moved   int             // unselected deliveries appended again to pass them
	copies  map[string]bool // IDs of the copies appended, not read yet
}

// laneHeld is what the session holds of one claimed lane, in the order
// Receive returned it: everything not yet settled and, on a log,
// settled messages behind an unsettled one (the committed position
// cannot pass that one).
type laneHeld struct {
	entries []*entry
}

type entry struct {
	d       *driver.Delivery
	size    int // d.Size() as received (a reader may drop the body)
	settled bool
}

type fetched struct {
	ds  []*driver.Delivery
	err error
}

// sessionOptions are the bounds of one session.
type sessionOptions struct {
	window int
	bytes  int
	idle   time.Duration
	wait   time.Duration
	// republish appends copies of deliveries to the topic (see settle)
	// and returns their IDs.
	republish func(ctx context.Context, ds []*driver.Delivery) ([]string, error)
}

// openSession joins the dead-letter topic's own group (named after the
// topic) on conn and starts receiving.
func openSession(ctx context.Context, conn driver.Conn, topic string, o sessionOptions) (*session, error) {
	s := &session{
		topic: topic, window: o.window, bytes: o.bytes, idle: o.idle, wait: o.wait, republish: o.republish,
		want: make(chan driver.Room), got: make(chan fetched),
		done: make(chan struct{}), lanes: map[string]*laneHeld{}, entries: map[*driver.Delivery]*entry{},
		copies: map[string]bool{}, last: time.Now(),
	}
	start := driver.StartLatest
	if conn.Capabilities().Replay {
		start = driver.StartEarliest
	}
	sub, err := conn.Subscribe(ctx, topic, driver.SubscribeOptions{
		Group: Group(topic), StartAt: start,
		MaxInFlight: o.window, MaxInFlightBytes: o.bytes, MaxHeld: o.window,
		Lanes: s,
	})
	if err != nil {
		return nil, fmt.Errorf("dlq: read %q: %w", topic, err)
	}
	s.sub = sub
	s.acker, _ = sub.(driver.Acker)
	if s.acker == nil {
		s.committer, _ = sub.(driver.Committer)
	}
	if s.acker == nil && s.committer == nil {
		_ = sub.Close()
		return nil, fmt.Errorf("dlq: read %q: the transport's subscriber neither acknowledges nor commits: %w", topic, driver.ErrUnsupported)
	}
	s.ordered = s.committer != nil || conn.Capabilities().Ordered
	// The group's lag on every lane, those the session does not hold
	// yet included (lanes of leases are claimed one at a time), where it
	// counts messages.
	if k := conn.Capabilities().Lag; k != driver.LagRecords && k != driver.LagDepth {
		// A lag in time says nothing of how much is left to read, but
		// one above 0 says that something is.
		if g, ok := conn.(driver.GroupLagReader); ok && k == driver.LagMillis {
			s.timeLag = func(ctx context.Context) ([]driver.LaneLag, error) { return g.GroupLag(ctx, topic, Group(topic)) }
		}
	} else if g, ok := conn.(driver.GroupLagReader); ok {
		s.lag = func(ctx context.Context) ([]driver.LaneLag, error) { return g.GroupLag(ctx, topic, Group(topic)) }
	} else if r, ok := sub.(driver.LagReader); ok {
		s.lag = r.Lag
	}
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go s.fetch(fctx) // ends with close
	return s, nil
}

// fetch calls Receive for each Room the caller asks with, and hands back
// what it returned.
func (s *session) fetch(ctx context.Context) {
	defer close(s.done)
	for {
		var room driver.Room
		select {
		case room = <-s.want:
		case <-ctx.Done():
			return
		}
		ds, err := s.sub.Receive(ctx, room)
		select {
		case s.got <- fetched{ds, err}:
		case <-ctx.Done():
			return // not settled: the transport has them back after Close
		}
	}
}

// close stops receiving and leaves the group: everything not settled
// goes back to the transport (brokers deliver it again, logs resume at
// the committed position).
func (s *session) close() error {
	s.cancel()
	<-s.done
	return s.sub.Close()
}

// errFull reports that the session holds its window and can read no more.
var errFull = errors.New("dlq: window full")

// next returns the next deliveries, held until settled, or none when the
// topic is drained: every message the group has to read is held here,
// by the group's lag where the transport tells it; else nothing came for
// the idle time; and in any case nothing came for the wait. It returns
// errFull when the window is full.
func (s *session) next(ctx context.Context, poll time.Duration) ([]*driver.Delivery, error) {
	t := time.NewTimer(poll)
	defer t.Stop()
	for {
		if !s.asked {
			room := s.room()
			if room.Count <= 0 || room.Bytes <= 0 {
				return nil, errFull
			}
			select {
			case s.want <- room:
				s.asked = true
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case f := <-s.got:
			s.asked = false
			if f.err != nil {
				return nil, fmt.Errorf("dlq: read %q: %w", s.topic, f.err)
			}
			if ds := s.hold(f.ds); len(ds) > 0 {
				s.last, s.received = time.Now(), true
				return ds, nil
			}
		case <-t.C:
			if s.drained(ctx) {
				return nil, nil
			}
			t.Reset(poll)
		}
	}
}

func (s *session) room() driver.Room {
	s.mu.Lock()
	defer s.mu.Unlock()
	return driver.Room{Count: s.window - s.held, Bytes: max(0, s.bytes-s.size), Oversize: s.held == 0}
}

// drained reports whether the read is over (see next). A lag read that
// fails (a slow server) or a lane whose lag is unknown (a JetStream
// partition's consumer being reset at its floor) keeps the read going,
// up to the wait: ending on a quiet moment would cut the list short.
// Where the lag is a time (Kinesis), nothing received yet while a lane's
// records wait (or the lag cannot be read) is no quiet moment either:
// the member may still be taking its leases and reading its first
// records.
func (s *session) drained(ctx context.Context) bool {
	quiet := time.Since(s.last)
	if quiet >= s.wait {
		return true
	}
	if s.lag == nil {
		if quiet < s.idle {
			return false
		}
		if s.timeLag == nil || s.received {
			return true
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lags, err := s.timeLag(lctx)
		cancel()
		if err != nil {
			return false
		}
		for _, l := range lags {
			if !l.Known || l.Lag > 0 {
				return false
			}
		}
		return true
	}
	if quiet < s.idle/2 {
		// Messages another client held may be on their way back (a
		// queue requeues what a closed channel held a moment after it
		// closed): a lag read the moment the last message came would
		// not count them yet.
		return false
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	lags, err := s.lag(lctx)
	cancel()
	n, ok := total(lags, err)
	return ok && n <= int64(s.heldCount())
}

// left reads how many messages the group has left to settle: its lag,
// -1 when unknown.
func (s *session) left(ctx context.Context) int64 {
	if s.lag == nil {
		return -1
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, ok := total(s.lag(lctx)); ok {
		return n
	}
	return -1
}

// total sums lags; ok is false when the read failed or a lane is unknown.
func total(lags []driver.LaneLag, err error) (n int64, ok bool) {
	if err != nil || len(lags) == 0 {
		return 0, false
	}
	for _, l := range lags {
		if !l.Known {
			return 0, false
		}
		n += l.Lag
	}
	return n, true
}

func (s *session) heldCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// hold records ds as held and returns those of lanes the session still
// claims (a delivery of a lane revoked meanwhile belongs to its next
// holder).
func (s *session) hold(ds []*driver.Delivery) []*driver.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ds[:0]
	for _, d := range ds {
		l := s.lanes[d.Lane]
		if l == nil {
			continue
		}
		e := &entry{d: d, size: d.Size()}
		l.entries = append(l.entries, e)
		s.entries[d] = e
		s.held++
		s.size += e.size
		out = append(out, d)
	}
	return out
}

// isCopy reports whether d is the copy of a dead letter the session
// appended again: it is held, and not read as a new one.
func (s *session) isCopy(d *driver.Delivery) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.copies[d.ID] {
		return false
	}
	delete(s.copies, d.ID)
	return true
}

// claimed returns those of ds whose lane the session still claims.
func (s *session) claimed(ds []*driver.Delivery) []*driver.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*driver.Delivery
	for _, d := range ds {
		if _, ok := s.entries[d]; ok {
			out = append(out, d)
		}
	}
	return out
}

// settle removes ds from the topic. On unordered lanes each message is
// acknowledged by itself. Ordered lanes are settled in order: a log's
// committed position passes a lane's messages in order, and a broker
// whose ordered lanes change hands at their acknowledgement floor (a
// JetStream partition) delivers again what was acknowledged above it.
// So that they pass what was settled, the held (unselected) messages
// before a lane's last settled one are first appended to the topic
// again, to stay in it after the position. The caller holds s.work.
func (s *session) settle(ctx context.Context, ds []*driver.Delivery) error {
	ds = s.claimed(ds)
	if len(ds) == 0 {
		return nil
	}
	if !s.ordered {
		if err := s.acker.Ack(ctx, ds); err != nil {
			return fmt.Errorf("dlq: acknowledge in %q: %w", s.topic, err)
		}
		s.mu.Lock()
		for _, d := range ds {
			s.dropLocked(d)
		}
		s.mu.Unlock()
		return nil
	}
	s.mu.Lock()
	touched := map[string]bool{}
	for _, d := range ds {
		s.entries[d].settled = true
		touched[d.Lane] = true
	}
	var move []*driver.Delivery
	for id := range touched {
		l := s.lanes[id]
		last := -1
		for i, e := range l.entries {
			if e.settled {
				last = i
			}
		}
		for _, e := range l.entries[:last+1] {
			if !e.settled {
				move = append(move, e.d)
			}
		}
	}
	s.mu.Unlock()
	if len(move) > 0 {
		ids, err := s.republish(ctx, move)
		if err != nil {
			return fmt.Errorf("dlq: append the %d dead letters left before them to %q again: %w", len(move), s.topic, err)
		}
		s.mu.Lock()
		for i, d := range move {
			if e := s.entries[d]; e != nil {
				e.settled = true
			}
			s.copies[ids[i]] = true
		}
		s.moved += len(move)
		s.mu.Unlock()
	}
	s.mu.Lock()
	var passed []*driver.Delivery // in lane order
	var commits []*driver.Delivery
	for id := range touched {
		l := s.lanes[id]
		if l == nil {
			continue // revoked meanwhile
		}
		var last *driver.Delivery
		for len(l.entries) > 0 && l.entries[0].settled {
			last = l.entries[0].d
			passed = append(passed, last)
			s.dropLocked(last)
		}
		if last != nil {
			commits = append(commits, last)
		}
	}
	s.mu.Unlock()
	var err error
	switch {
	case len(passed) == 0:
	case s.acker != nil:
		err = s.acker.Ack(ctx, passed)
	default:
		err = s.committer.Commit(ctx, commits)
	}
	if err != nil {
		return fmt.Errorf("dlq: settle in %q: %w", s.topic, err)
	}
	return nil
}

// dropLocked forgets d.
func (s *session) dropLocked(d *driver.Delivery) {
	e := s.entries[d]
	if e == nil {
		return
	}
	delete(s.entries, d)
	s.held--
	s.size -= e.size
	l := s.lanes[d.Lane]
	for i, x := range l.entries {
		if x == e {
			l.entries = append(l.entries[:i], l.entries[i+1:]...)
			break
		}
	}
}

// Claimed implements driver.Lanes.
func (s *session) Claimed(lanes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range lanes {
		if s.lanes[id] == nil {
			s.lanes[id] = &laneHeld{}
		}
	}
}

// Revoked implements driver.Lanes: it waits for a batch in progress to
// be settled, then forgets the lanes (what the session held there goes
// to their next holder, unsettled).
func (s *session) Revoked(_ context.Context, lanes []string) {
	s.work.Lock()
	defer s.work.Unlock()
	s.forget(lanes)
}

// Lost implements driver.Lanes: the lanes go at once.
func (s *session) Lost(lanes []string) { s.forget(lanes) }

func (s *session) forget(lanes []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range lanes {
		l := s.lanes[id]
		if l == nil {
			continue
		}
		for _, e := range l.entries {
			delete(s.entries, e.d)
			s.held--
			s.size -= e.size
		}
		delete(s.lanes, id)
	}
}

package omnibus_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/membus"
)

// waitingConn is a membus connection whose subscribers' Receive waits
// for deliveries, as Kafka's and Redis's do, instead of returning empty
// when membus wakes it: only a revocation or a loss of lanes makes the
// Receive in progress return empty (drivers make Receive return
// promptly then), once the engine waits for it.
type waitingConn struct{ driver.Conn }

func (c *waitingConn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	s := &waitingSub{}
	opts.Lanes = &waitingLanes{Lanes: opts.Lanes, s: s}
	inner, err := c.Conn.Subscribe(ctx, topic, opts)
	if err != nil {
		return nil, err
	}
	s.Subscriber = inner
	return s, nil
}

type waitingSub struct {
	driver.Subscriber

	mu     sync.Mutex
	cancel context.CancelFunc // the Receive in progress's, when one is
}

func (s *waitingSub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.cancel = cancel
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.cancel = nil
		s.mu.Unlock()
	}()
	for {
		ds, err := s.Subscriber.Receive(rctx, room)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case rctx.Err() != nil:
			return nil, nil // stopped
		case err != nil || len(ds) > 0:
			return ds, err
		}
	}
}

// Commit passes the engine's commits to membus.
func (s *waitingSub) Commit(ctx context.Context, ds []*driver.Delivery) error {
	return s.Subscriber.(driver.Committer).Commit(ctx, ds)
}

// stop makes the Receive in progress return empty.
func (s *waitingSub) stop() {
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
}

// waitingLanes passes the driver's calls to the engine. A revocation or
// a loss stops the Receive in progress once the engine waits for it
// (20ms after the call), so that the Receive it waits for is the one
// stopped, not one started before it began to wait.
type waitingLanes struct {
	driver.Lanes
	s *waitingSub
}

func (l *waitingLanes) Revoked(ctx context.Context, ids []string) {
	l.stopDuring(func() { l.Lanes.Revoked(ctx, ids) })
}

func (l *waitingLanes) Lost(ids []string) {
	l.stopDuring(func() { l.Lanes.Lost(ids) })
}

func (l *waitingLanes) stopDuring(call func()) {
	done := make(chan struct{})
	go func() { // ends with the engine's call
		defer close(done)
		call()
	}()
	select {
	case <-done:
		return
	case <-time.After(20 * time.Millisecond):
	}
	l.s.stop()
	<-done
}

// runCounting opens a client over conn and runs a member of group g on
// topic (two lanes) that counts what it handles, with opts besides; it
// returns once a message on each lane was handled, so that the member's
// fetch loop waits in Receive on an idle topic.
func runCounting(t *testing.T, conn driver.Conn, topic string, opts ...omnibus.SubscribeOption) (*omnibus.Client, *counter) {
	t.Helper()
	c, err := omnibus.New(conn, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	handled := newCounter()
	a, err := c.Subscribe(context.Background(), topic, func(ctx context.Context, m *omnibus.Message) error {
		handled.add(m.ID)
		return nil
	}, append([]omnibus.SubscribeOption{omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	go a.Run(context.Background())
	t.Cleanup(func() { a.Close() })
	warm := publishKeys(t, c, topic, keyOn(0, 2, 0), keyOn(1, 2, 1))
	waitFor(t, func() bool { return handled.count(warm) == len(warm) }, "the first messages")
	return c, handled
}

// TestLaneClaimedBackByTheSameMember: a lane revoked from a member and
// claimed back by it while its fetch loop waits in Receive. The fetch
// loop must not start a Receive between the revocation's wait for the
// Receive in progress and its marking of the lane: that Receive would
// carry the epoch from before the marking, and the deliveries of the
// claim that follows (which it returns) would be dropped as the old
// claim's; the transport, having handed them over, does not deliver them
// again. Every message published to the lane meanwhile must be handled.
func TestLaneClaimedBackByTheSameMember(t *testing.T) {
	const topic = "reclaim"
	// The member's fetch loop waits in Receive, on both lanes.
	c, handled := runCounting(t, &waitingConn{Conn: membus.New(membus.Config{Partitions: 2}).Conn()}, topic)
	time.Sleep(50 * time.Millisecond)

	// Again and again: a second member (never run) takes lane 1 (the
	// first member's Receive returns for the revocation), messages are
	// published to lane 1, held for the second member, which reads
	// nothing, and it leaves: lane 1 comes back to the first member,
	// whose Receive returns them.
	for round := range 10 {
		b, err := c.Subscribe(context.Background(), topic, func(context.Context, *omnibus.Message) error { return nil },
			omnibus.Group("g"))
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]string, 10)
		for i := range keys {
			keys[i] = keyOn(1, 2, 100*round+i)
		}
		ids := publishKeys(t, c, topic, keys...)
		within(t, 5*time.Second, "Close of the second consumer", func() { _ = b.Close() })
		deadline := time.Now().Add(2 * time.Second)
		for handled.count(ids) < len(ids) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := handled.count(ids); got != len(ids) {
			t.Fatalf("round %d: %d of the %d messages published while the lane was away were handled after it came back", round, got, len(ids))
		}
	}
}

// gapConn is a membus connection whose subscribers wake their Receive
// only before calling Revoked, as membus, natsbus, redisbus and kafkabus
// do, and wait until the engine has started the next Receive before they
// call it: that Receive waits for data on an idle topic. Only Wake
// (driver.Waker), which the engine calls once it waits, ends it.
type gapConn struct {
	driver.Conn

	mu    sync.Mutex
	lanes []*gapLanes // each subscriber's, in order
}

func (c *gapConn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	s := &gapSub{began: make(chan struct{}, 1)}
	s.inner = &waitingSub{}
	l := &gapLanes{Lanes: opts.Lanes, s: s}
	c.mu.Lock()
	c.lanes = append(c.lanes, l)
	c.mu.Unlock()
	opts.Lanes = l
	inner, err := c.Conn.Subscribe(ctx, topic, opts)
	if err != nil {
		return nil, err
	}
	s.inner.Subscriber = inner
	return s, nil
}

type gapSub struct {
	inner *waitingSub
	began chan struct{} // a Receive began

	mu    sync.Mutex
	woken bool // Wake came with no Receive to stop: the next returns at once
}

func (s *gapSub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	s.mu.Lock()
	woken := s.woken
	s.woken = false
	s.mu.Unlock()
	if woken {
		return nil, nil
	}
	driver.Notify(s.began)
	return s.inner.Receive(ctx, room)
}

func (s *gapSub) Commit(ctx context.Context, ds []*driver.Delivery) error {
	return s.inner.Commit(ctx, ds)
}

func (s *gapSub) Close() error { return s.inner.Close() }

// Wake implements driver.Waker.
func (s *gapSub) Wake() {
	s.mu.Lock()
	s.inner.mu.Lock()
	if s.inner.cancel != nil {
		s.inner.cancel()
	} else {
		s.woken = true
	}
	s.inner.mu.Unlock()
	s.mu.Unlock()
}

type gapLanes struct {
	driver.Lanes
	s *gapSub
}

func (l *gapLanes) Revoked(ctx context.Context, ids []string) {
	l.wakeFirst()
	l.Lanes.Revoked(ctx, ids)
}

func (l *gapLanes) Lost(ids []string) {
	l.wakeFirst()
	l.Lanes.Lost(ids)
}

// wakeFirst stops the Receive in progress, if one is, and waits (a
// second at most) for the fetch loop to start the next.
func (l *gapLanes) wakeFirst() {
	l.s.inner.mu.Lock()
	receiving := l.s.inner.cancel != nil
	l.s.inner.mu.Unlock()
	if !receiving {
		return
	}
	select {
	case <-l.s.began: // the one in progress
	default:
	}
	l.s.inner.stop()
	select {
	case <-l.s.began:
	case <-time.After(time.Second):
	}
	time.Sleep(10 * time.Millisecond) // it waits in membus
}

// TestRevocationWakesTheReceiveItWaitsFor: a driver wakes its Receive
// before calling Revoked, and the fetch loop starts another in between,
// on an idle topic. The revocation waits for that one: the engine must
// wake it (driver.Waker), or the handover takes DrainTimeout.
func TestRevocationWakesTheReceiveItWaitsFor(t *testing.T) {
	const topic = "gap"
	drain := omnibus.DrainTimeout(30 * time.Second)
	c, handled := runCounting(t, &gapConn{Conn: membus.New(membus.Config{Partitions: 2}).Conn()}, topic, drain)
	h := func(ctx context.Context, m *omnibus.Message) error {
		handled.add(m.ID)
		return nil
	}
	for round := range 3 {
		time.Sleep(50 * time.Millisecond) // idle: the fetch loop waits in Receive
		began := time.Now()
		var b *omnibus.Consumer
		var err error
		within(t, 5*time.Second, "a second member joining (lane 1 revoked from the first)", func() {
			b, err = c.Subscribe(context.Background(), topic, h, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), drain)
		})
		if err != nil {
			t.Fatal(err)
		}
		within(t, 5*time.Second, "the second member leaving", func() { _ = b.Close() })
		ids := publishKeys(t, c, topic, keyOn(0, 2, 10*round+2), keyOn(1, 2, 10*round+3))
		waitFor(t, func() bool { return handled.count(ids) == len(ids) }, "messages published after the handover")
		t.Logf("round %d: handover and back in %v", round, time.Since(began).Round(time.Millisecond))
	}
}

// TestLossWakesTheReceiveItWaitsFor is the gap on a loss: Lost waits a
// second at most for the Receive in progress, which the engine must wake.
func TestLossWakesTheReceiveItWaitsFor(t *testing.T) {
	const topic = "gap-lost"
	fc := &gapConn{Conn: membus.New(membus.Config{Partitions: 2}).Conn()}
	c, handled := runCounting(t, fc, topic)
	fc.mu.Lock()
	lanes := fc.lanes[0]
	fc.mu.Unlock()
	for round := range 3 {
		time.Sleep(50 * time.Millisecond) // idle: the fetch loop waits in Receive
		began := time.Now()
		lanes.Lost([]string{"0"})
		took := time.Since(began)
		t.Logf("round %d: Lost took %v", round, took.Round(time.Millisecond))
		if took > 500*time.Millisecond {
			t.Errorf("round %d: Lost took %v: it waited for a Receive nobody woke", round, took.Round(time.Millisecond))
		}
		// The lane comes back, as after a new session. A Receive that
		// outlived Lost's wait would drop the new claim's deliveries as
		// the old one's.
		lanes.Claimed([]string{"0"})
		ids := publishKeys(t, c, topic, keyOn(0, 2, 10*round+2), keyOn(1, 2, 10*round+3))
		deadline := time.Now().Add(5 * time.Second)
		for handled.count(ids) < len(ids) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := handled.count(ids); got != len(ids) {
			t.Fatalf("round %d: %d of the %d messages published after the lane came back were handled", round, got, len(ids))
		}
	}
}

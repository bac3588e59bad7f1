package transporttest

// Ordering and groups: order per lane and per key, a group's members
// splitting the lanes and taking them over, every group getting every
// message, replay from the earliest or the latest, a group's lag, and
// (hostile) a revocation whose drain must not stall the lanes that stay.
// The tests run on the test's goroutine; handlers run on the consumer's
// workers and record into collectors (guarded by their mutex) or into
// state under the test's own mutex.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

func (s *suite) testOrderPerLane(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().Ordered, "Ordered")
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Order(omnibus.OrderLane), omnibus.MaxInFlight(64))...)
	stop := RunConsumer(t, k)
	col.await(t, publishN(t, pub, topic, 2000, 20, 16))
	stop()
	col.check(t, laneOrder, false)
}

func (s *suite) testOrderPerKey(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().Ordered, "Ordered")
	topic := s.topic(t, pub)
	col := newCollector()
	var running, peak atomic.Int64
	h := func(ctx context.Context, m *omnibus.Message) error {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		col.add(m)
		running.Add(-1)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Order(omnibus.OrderKey), omnibus.MaxInFlight(128))...)
	stop := RunConsumer(t, k)
	const keys = 50
	col.await(t, publishN(t, pub, topic, 3000, keys, 16))
	stop()
	col.check(t, keyOrder, false)
	if peak.Load() <= int64(s.h.Lanes) {
		t.Errorf("key mode ran at most %d handlers at once with %d lanes and %d keys; want more than the lane count", peak.Load(), s.h.Lanes, keys)
	}
}

func (s *suite) testGroupTakeover(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	h := func(ctx context.Context, m *omnibus.Message) error {
		time.Sleep(200 * time.Microsecond)
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Group("takeover"), omnibus.Members(2), omnibus.DrainTimeout(10*time.Second))...)
	stop := RunConsumer(t, k)
	const n = 4000
	ids := publishN(t, pub, topic, n/2, 40, 32)
	if pub.Capabilities().ExclusiveLanes {
		// Both members hold lanes. Messages keep coming while we wait: on
		// some transports a member learns it holds a lane from its first
		// delivery.
		split := func() bool {
			members := map[int]bool{}
			for _, l := range k.Stats().Lanes {
				if l.Member >= 0 {
					members[l.Member] = true
				}
			}
			return len(members) == 2
		}
		for deadline := time.Now().Add(timeout); !split(); {
			if time.Now().After(deadline) {
				t.Fatalf("after %v: lanes not split over 2 members: %+v", timeout, k.Stats().Lanes)
			}
			ids = append(ids, publishN(t, pub, topic, 40, 40, 32)...)
			time.Sleep(100 * time.Millisecond)
		}
	}
	Eventually(t, timeout, func() bool { return col.unique() > n/8 }, func() string { return "no progress" })
	// One member leaves mid-stream; the other takes its lanes over.
	if err := k.Scale(ctxT(t), 1); err != nil {
		t.Fatalf("Scale(1): %v", err)
	}
	ids = append(ids, publishN(t, pub, topic, n/2, 40, 32)...)
	col.await(t, ids)
	stop()
	// Lanes changed hands gracefully (drained and committed first): not
	// one message may come back.
	col.check(t, orderOf(pub), false)
}

func (s *suite) testGroups(t *testing.T) {
	pub := s.open(t)
	need(t, pub.Capabilities().Groups, "Groups")
	topic := s.topic(t, pub)
	cols := []*collector{newCollector(), newCollector()}
	for i, col := range cols {
		k := s.subscribe(t, s.open(t), topic, col.handler, append(earliest(pub), omnibus.Group(fmt.Sprintf("g%d", i)))...)
		RunConsumer(t, k)
	}
	ids := publishN(t, pub, topic, 500, 10, 8)
	for _, col := range cols {
		col.await(t, ids)
		col.check(t, orderOf(pub), false)
	}
}

func (s *suite) testReplay(t *testing.T) {
	pub := s.open(t)
	need(t, pub.Capabilities().Replay, "Replay")
	topic := s.topic(t, pub)
	ids := publishN(t, pub, topic, 300, 5, 8)
	// A group created after the messages, asking for the earliest.
	col := newCollector()
	k := s.subscribe(t, s.open(t), topic, col.handler, omnibus.Group("late"), omnibus.StartFrom(omnibus.StartEarliest))
	RunConsumer(t, k)
	col.await(t, ids)
	// A new group asking for the latest sees only what comes after it.
	late := newCollector()
	k2 := s.subscribe(t, s.open(t), topic, late.handler, omnibus.Group("latest"), omnibus.StartFrom(omnibus.StartLatest))
	RunConsumer(t, k2)
	time.Sleep(500 * time.Millisecond) // let the group join before publishing
	more := publishN(t, pub, topic, 10, 5, 8)
	Eventually(t, timeout, func() bool { return late.unique() >= 10 }, func() string {
		return fmt.Sprintf("latest group received %d of 10", late.unique())
	})
	if miss := late.missing(more); len(miss) > 0 {
		t.Fatalf("latest group lost %d", len(miss))
	}
	if got := late.unique(); got != 10 {
		t.Errorf("a group starting at the latest received %d messages, want the 10 published after it", got)
	}
	col.check(t, orderOf(pub), false)
	late.check(t, orderOf(pub), false)
}

func (s *suite) testLag(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	caps := pub.Capabilities()
	need(t, caps.Lag != 0, "Lag")
	topic := s.topic(t, pub)
	release := make(chan struct{})
	col := newCollector()
	h := func(ctx context.Context, m *omnibus.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Group("lag"), omnibus.MaxInFlight(10))...)
	total := func() (int64, bool) {
		lags, err := k.Lag(ctxT(t))
		if err != nil {
			t.Fatalf("Lag: %v", err)
		}
		var sum int64
		for _, l := range lags {
			if !l.Known {
				return 0, false
			}
			sum += l.Lag
		}
		return sum, true
	}
	RunConsumer(t, k)
	const n = 200
	publishN(t, pub, topic, n, 10, 8)
	var last int64
	if caps.Lag == driver.LagMillis {
		// A time lag: the messages waiting have waited.
		Eventually(t, timeout, func() bool {
			lag, ok := total()
			last = lag
			return ok && lag > 0
		}, func() string {
			return fmt.Sprintf("lag %dms with %d unprocessed messages", last, n)
		})
	} else {
		Eventually(t, timeout, func() bool {
			lag, ok := total()
			last = lag
			return ok && lag >= n-20 && lag <= n
		}, func() string {
			return fmt.Sprintf("lag %d with %d unprocessed messages (at most 10 in flight)", last, n)
		})
	}
	close(release)
	Eventually(t, timeout, func() bool {
		lag, ok := total()
		last = lag
		return ok && lag == 0 && col.unique() == n
	}, func() string { return fmt.Sprintf("lag %d after consuming %d of %d", last, col.unique(), n) })
	col.check(t, orderOf(pub), false)
}

// --- what one lane does must not stall the others ---

// testRevocationKeepsOtherLanes revokes a lane whose handler holds on
// (the drain waits for it) and measures, per lane, how long messages
// published meanwhile wait: the lanes the member keeps go on flowing.
func (s *suite) testRevocationKeepsOtherLanes(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().ExclusiveLanes, "ExclusiveLanes")
	if s.h.Lanes < 2 {
		t.Skip("SKIP (harness Lanes): with one lane nothing stays when a lane moves")
	}
	topic := s.topic(t, pub)
	wait, release := released()
	var mu sync.Mutex
	blocked := map[string]bool{}        // lanes with a handler holding on
	worst := map[string]time.Duration{} // per lane, the longest a probe waited
	h := func(ctx context.Context, m *omnibus.Message) error {
		if strings.HasPrefix(m.Key, "block") {
			mu.Lock()
			blocked[m.Lane] = true
			mu.Unlock()
			select {
			case <-wait:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		waited := time.Since(m.Time)
		mu.Lock()
		worst[m.Lane] = max(worst[m.Lane], waited)
		mu.Unlock()
		return nil
	}
	probes := newCollector()
	k := s.subscribe(t, sub, topic, func(ctx context.Context, m *omnibus.Message) error {
		if err := h(ctx, m); err != nil {
			return err
		}
		probes.add(m)
		return nil
	}, append(earliest(sub), omnibus.DrainTimeout(30*time.Second))...)
	t.Cleanup(release)
	stop := RunConsumer(t, k)
	// A handler holds on in every lane.
	publishKeys(t, pub, topic, 64, 8, func(i int) string { return "block" + strconv.Itoa(i) })
	Eventually(t, timeout, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(blocked) == s.h.Lanes
	}, func() string { return fmt.Sprintf("handlers hold on in lanes %v, want all %d", blocked, s.h.Lanes) })
	// A second member joins: the first gives lanes up, and each drain
	// waits for the handler holding on. Messages keep coming meanwhile.
	scaled := make(chan error, 1)
	go func() { scaled <- k.Scale(ctxT(t), 2) }()
	const window, stall = 6 * time.Second, 2500 * time.Millisecond
	var ids []string
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		ids = append(ids, publishKeys(t, pub, topic, 40, 8, func(i int) string { return "probe" + strconv.Itoa(i) })...)
	}
	release()
	probes.await(t, ids)
	select {
	case err := <-scaled:
		if err != nil {
			t.Fatalf("Scale(2): %v", err)
		}
	case <-time.After(timeout):
		t.Fatalf("Scale(2) did not return within %v of the handlers' release", timeout)
	}
	var kept []string
	Eventually(t, timeout, func() bool {
		kept = kept[:0]
		members := map[int]bool{}
		for _, l := range k.Stats().Lanes {
			members[l.Member] = true
			if l.Member == 0 {
				kept = append(kept, l.Lane)
			}
		}
		return members[0] && members[1]
	}, func() string { return fmt.Sprintf("lanes not split over 2 members: %+v", k.Stats().Lanes) })
	stop()
	mu.Lock()
	defer mu.Unlock()
	var stalled []string
	for lane, d := range worst {
		if d > stall {
			stalled = append(stalled, lane)
		}
	}
	slices.Sort(stalled)
	t.Logf("per lane, the longest a message waited: %v; member 0 kept %v", worst, kept)
	if len(stalled) == 0 {
		t.Fatalf("no lane waited for a drain in the %v window: the revocation came too late to measure anything", window)
	}
	for _, lane := range kept {
		if worst[lane] > stall {
			t.Errorf("lane %s stayed with its member, yet a message on it waited %v while other lanes drained", lane, worst[lane].Round(time.Millisecond))
		}
	}
	// Messages of the drained lanes waited the whole window: beyond an ack
	// deadline, a transport may deliver them twice, never out of order.
	probes.check(t, keyOrder, s.h.AckDeadline > 0 && s.h.AckDeadline < window)
}

package transporttest

// Callbacks that call back in (hostile): observers that call Stats, Lag,
// Close or Shutdown, and handlers that call Close, Shutdown or Scale, on
// their own consumer. Each call must return, the consumer stop, and no
// goroutine be left. The calls run on the consumer's own goroutines (its
// observers' and workers'); the tests wait for them on the test's
// goroutine, each step within a bound, and share state through atomics
// and a mutex of their own.

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// --- callbacks that call back in ---

// testObserverCallsBack calls the consumer from its own observer: Stats
// and Lag on every kind of event (retries included), and Close or
// Shutdown. Nothing may deadlock.
func (s *suite) testObserverCallsBack(t *testing.T) {
	t.Run("StatsAndLag", func(t *testing.T) {
		pub, sub := s.open(t), s.open(t)
		topic := s.topic(t, pub)
		var kp atomic.Pointer[omnibus.Consumer]
		var events, lags atomic.Int64
		observe := func(e omnibus.Event) {
			k := kp.Load()
			if k == nil {
				return
			}
			n := events.Add(1)
			_ = k.Stats()
			if k.Capabilities().Lag != 0 && (e.Kind != omnibus.EventProcessed || n%50 == 0) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = k.Lag(ctx)
				cancel()
				lags.Add(1)
			}
		}
		col := newCollector()
		h := func(ctx context.Context, m *omnibus.Message) error {
			if m.Attempt == 1 && crc32.ChecksumIEEE([]byte(m.ID))%4 == 0 {
				return errors.New("injected failure")
			}
			col.add(m)
			return nil
		}
		k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Observe(observe), omnibus.Backoff(5*time.Millisecond, 20*time.Millisecond))...)
		kp.Store(k)
		done := start(context.Background(), k)
		ids := publishN(t, pub, topic, 200, 10, 8)
		Eventually(t, 30*time.Second, func() bool { return len(col.missing(ids)) == 0 }, func() string {
			return fmt.Sprintf("%d of %d handled with an observer calling Stats and Lag (%d events, %d Lag calls); goroutines:\n%s",
				col.unique(), len(ids), events.Load(), lags.Load(), stacks(t))
		})
		if within(t, hang, "Consumer.Close", func() { _ = k.Close() }) {
			awaitRun(t, done, hang)
		}
		t.Logf("%d events observed, %d Lag calls from the observer", events.Load(), lags.Load())
	})
	t.Run("Close", func(t *testing.T) {
		s.observerStops(t, func(k *omnibus.Consumer) error { return k.Close() })
	})
	t.Run("Shutdown", func(t *testing.T) {
		s.observerStops(t, func(k *omnibus.Consumer) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return k.Shutdown(ctx)
		})
	})
}

// observerStops calls stop from the observer, at the first message
// processed: stop, Run and the client's Close return, and no goroutine is
// left.
func (s *suite) observerStops(t *testing.T, stop func(*omnibus.Consumer) error) {
	markGoroutines(t)
	leaks := leakCheck(t)
	c := s.open(t)
	topic := s.topic(t, c)
	var kp atomic.Pointer[omnibus.Consumer]
	var called atomic.Bool
	returned := make(chan error, 1)
	observe := func(e omnibus.Event) {
		if k := kp.Load(); k != nil && e.Kind == omnibus.EventProcessed && called.CompareAndSwap(false, true) {
			returned <- stop(k)
		}
	}
	k, err := c.Subscribe(ctxT(t), topic, func(context.Context, *omnibus.Message) error { return nil }, append(earliest(c), omnibus.Observe(observe))...)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	kp.Store(k)
	done := start(context.Background(), k)
	publishN(t, c, topic, 20, 4, 8)
	select {
	case err := <-returned:
		t.Logf("called from the observer: %v", err)
	case <-time.After(hang):
		t.Fatalf("called from the observer, it did not return within %v; goroutines:\n%s", hang, stacks(t))
	}
	closeAll(t, k, done, c, leaks)
}

// closeAll closes k from outside, whatever a call from inside it
// answered, waits for its Run (done) to return, closes c and checks that
// no goroutine is left, each step bounded.
func closeAll(t *testing.T, k *omnibus.Consumer, done <-chan error, c *omnibus.Client, leaks func()) {
	t.Helper()
	if !within(t, hang, "Consumer.Close", func() { _ = k.Close() }) {
		return
	}
	if _, ok := awaitRun(t, done, hang); !ok {
		return
	}
	if within(t, hang, "Client.Close", func() { _ = c.Close() }) {
		leaks()
	}
}

// --- calls from inside a handler ---

// testHandlerCallsBack calls Close, Shutdown and Scale from inside a
// handler: each returns (an error is fine), the consumer stops, and no
// goroutine is left.
func (s *suite) testHandlerCallsBack(t *testing.T) {
	t.Run("Close", func(t *testing.T) {
		s.handlerCalls(t, 1, func(k *omnibus.Consumer) error { return k.Close() })
	})
	t.Run("Shutdown", func(t *testing.T) {
		s.handlerCalls(t, 1, func(k *omnibus.Consumer) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return k.Shutdown(ctx)
		})
	})
	t.Run("ScaleDown", func(t *testing.T) {
		s.handlerCalls(t, 2, func(k *omnibus.Consumer) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return k.Scale(ctx, 1)
		})
	})
}

// handlerCalls runs call from inside a handler of a consumer of members
// members: with more than one, from a handler of the newest member (the
// one Scale removes) where the lanes tell members apart, and from
// handlers of every member where they do not.
func (s *suite) handlerCalls(t *testing.T, members int, call func(*omnibus.Consumer) error) {
	markGoroutines(t)
	leaks := leakCheck(t)
	c := s.open(t)
	topic := s.topic(t, c)
	var kp atomic.Pointer[omnibus.Consumer]
	var claimed atomic.Bool // with one member: the handler that calls
	var called atomic.Bool  // a handler made the call, or is making it
	var inCall atomic.Int64 // calls not returned yet
	var mu sync.Mutex
	var results []string
	h := func(ctx context.Context, m *omnibus.Message) error {
		k := kp.Load()
		if k == nil || called.Load() {
			return nil
		}
		from := "the only member"
		if members == 1 && !claimed.CompareAndSwap(false, true) {
			return nil
		}
		if members > 1 {
			// Scale removes the newest member: the call must come from
			// it. Where one member holds the lane, the handler knows
			// whose it is; elsewhere every handler calls once every
			// member runs one.
			switch owner := laneOwner(k, m.Lane); {
			case owner >= 0 && owner != members-1:
				return nil
			case owner >= 0:
				from = "the member removed"
			default:
				for end := time.Now().Add(hang); len(busyMembers(k)) < members && time.Now().Before(end) && ctx.Err() == nil; {
					time.Sleep(10 * time.Millisecond)
				}
				from = fmt.Sprintf("any member (%d of %d running a handler)", len(busyMembers(k)), members)
			}
		}
		inCall.Add(1)
		called.Store(true)
		defer inCall.Add(-1)
		began := time.Now()
		err := call(k)
		mu.Lock()
		results = append(results, fmt.Sprintf("from %s: %v after %v", from, err, time.Since(began).Round(time.Millisecond)))
		mu.Unlock()
		return nil
	}
	k, err := c.Subscribe(ctxT(t), topic, h, append(earliest(c), omnibus.Members(members), omnibus.DrainTimeout(2*time.Second))...)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	kp.Store(k)
	done := start(context.Background(), k)
	// Messages keep coming until a handler calls: on some transports the
	// newest member gets lanes only when another gives them up.
	var last time.Time
	Eventually(t, timeout, func() bool {
		if !called.Load() && time.Since(last) > 200*time.Millisecond {
			publishN(t, c, topic, 20, 20, 8)
			last = time.Now()
		}
		return called.Load()
	}, func() string { return fmt.Sprintf("no handler called; lanes %+v", k.Stats().Lanes) })
	for end := time.Now().Add(hang); inCall.Load() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("called from inside a handler, it did not return within %v; goroutines:\n%s", hang, stacks(t))
		}
	}
	mu.Lock()
	t.Logf("called from inside handlers: %v", results)
	mu.Unlock()
	closeAll(t, k, done, c, leaks)
}

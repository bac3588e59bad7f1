package transporttest

// Lifecycle and shutdown: Shutdown commits what was settled, a context's
// cancellation, Close (idempotent, no goroutine left), and (hostile)
// handlers that ignore their context, which Shutdown, Scale and Run's
// drain wait for only until their deadline. The tests run on the test's
// goroutine, each call that could hang within a bound; handlers run on
// the consumer's workers.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func (s *suite) testShutdownCommits(t *testing.T) {
	pub := s.open(t)
	topic := s.topic(t, pub)
	first := newCollector()
	h := func(ctx context.Context, m *omnibus.Message) error {
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		first.add(m)
		return nil
	}
	c1 := s.open(t)
	k := s.subscribe(t, c1, topic, h, append(earliest(pub), omnibus.Group("drain"))...)
	done := make(chan error, 1)
	go func() { done <- k.Run(context.Background()) }()
	const n = 1000
	ids := publishN(t, pub, topic, n, 20, 8)
	Eventually(t, timeout, func() bool { return first.unique() > n/3 }, func() string { return "no progress" })
	if err := k.Shutdown(ctxT(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	handled := first.unique()
	// The same group resumes after what was settled: nothing lost, and
	// nothing settled before the shutdown comes back.
	second := newCollector()
	k2 := s.subscribe(t, s.open(t), topic, second.handler, append(earliest(pub), omnibus.Group("drain"))...)
	RunConsumer(t, k2)
	Eventually(t, timeout, func() bool {
		return first.unique()+second.unique() >= n && len(second.missing(first.missing(ids))) == 0
	}, func() string {
		return fmt.Sprintf("first run %d, second run %d, of %d", handled, second.unique(), n)
	})
	time.Sleep(300 * time.Millisecond)
	first.check(t, orderOf(pub), false)
	second.check(t, orderOf(pub), false)
	second.mu.Lock()
	defer second.mu.Unlock()
	again := 0
	for id := range second.ids {
		if first.ids[id] > 0 {
			again++
		}
	}
	if again > 0 {
		t.Errorf("%d messages settled before Shutdown were delivered again to the same group", again)
	}
}

func (s *suite) testCancel(t *testing.T) {
	c := s.open(t)
	topic := s.topic(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with a cancelled context: got %v, want context.Canceled", err)
	}
	started := make(chan struct{}, 1)
	k := s.subscribe(t, c, topic, func(ctx context.Context, m *omnibus.Message) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done() // a handler that waits for its context
		return ctx.Err()
	}, append(earliest(c), omnibus.DrainTimeout(time.Second))...)
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(rctx) }()
	time.Sleep(100 * time.Millisecond)
	publishN(t, c, topic, 5, 1, 8)
	select {
	case <-started:
	case <-time.After(timeout):
		t.Fatal("handler never started")
	}
	rcancel()
	select {
	case err := <-done:
		// The handlers return only when their context ends, at the
		// drain's deadline: Run reports what was left unsettled.
		var ue *omnibus.UnsettledError
		if err != nil && !errors.As(err, &ue) {
			t.Errorf("Run after cancellation: %v, want nil or an *UnsettledError", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's cancellation (DrainTimeout 1s)")
	}
}

func (s *suite) testClose(t *testing.T) {
	leaks := leakCheck(t)
	func() {
		c := s.h.Open(ctxT(t), t)
		topic := s.topic(t, c)
		col := newCollector()
		k, err := c.Subscribe(ctxT(t), topic, col.handler, earliest(c)...)
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- k.Run(context.Background()) }()
		col.await(t, publishN(t, c, topic, 100, 4, 8))
		col.check(t, orderOf(c), false)
		if err := k.Close(); err != nil {
			t.Errorf("Consumer.Close: %v", err)
		}
		if err := k.Close(); err != nil {
			t.Errorf("second Consumer.Close: %v", err)
		}
		<-done
		if err := k.Shutdown(ctxT(t)); !errors.Is(err, omnibus.ErrClosed) {
			t.Errorf("Shutdown after Close: got %v, want ErrClosed", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Client.Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("second Client.Close: %v", err)
		}
		if err := c.Publish(ctxT(t), topic, &omnibus.Message{}); !errors.Is(err, omnibus.ErrClosed) {
			t.Errorf("Publish after Close: got %v, want ErrClosed", err)
		}
		if _, err := c.Subscribe(ctxT(t), topic, col.handler); !errors.Is(err, omnibus.ErrClosed) {
			t.Errorf("Subscribe after Close: got %v, want ErrClosed", err)
		}
	}()
	leaks()
}

// --- handlers that ignore their context ---

// testHandlerIgnoresContext stops a consumer whose handlers ignore their
// context: Shutdown, Scale and Run's drain return by their deadline with
// the messages left unsettled, and Close after such a Shutdown returns.
// (Close alone waits for the handlers, as documented.)
func (s *suite) testHandlerIgnoresContext(t *testing.T) {
	// Shutdown commits what is settled with a short grace after its
	// deadline; beyond this the call is stuck.
	const deadline, grace = time.Second, 3 * time.Second
	t.Run("Shutdown", func(t *testing.T) {
		k, _, _ := s.stuckHandlers(t, 1)
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		var err error
		if within(t, deadline+grace, "Shutdown", func() { err = k.Shutdown(ctx) }) {
			checkUnsettled(t, "Shutdown", err)
			within(t, grace, "Close after Shutdown", func() { _ = k.Close() })
		}
	})
	t.Run("RunDrain", func(t *testing.T) {
		_, cancel, done := s.stuckHandlers(t, 1, omnibus.DrainTimeout(deadline))
		began := time.Now()
		cancel()
		if err, ok := awaitRun(t, done, deadline+grace); ok {
			t.Logf("Run returned after %v", time.Since(began).Round(time.Millisecond))
			checkUnsettled(t, "Run's drain", err)
		}
	})
	t.Run("ScaleDown", func(t *testing.T) {
		k, _, _ := s.stuckHandlers(t, 2, omnibus.DrainTimeout(deadline))
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		var err error
		if within(t, deadline+grace, "Scale(1)", func() { err = k.Scale(ctx, 1) }) {
			checkUnsettled(t, "Scale(1)", err)
		}
	})
}

// stuckHandlers subscribes members whose handlers wait, ignoring their
// context, until the test ends, and returns once every member runs one.
// cancel cancels Run's context; done has Run's result.
func (s *suite) stuckHandlers(t *testing.T, members int, opts ...omnibus.SubscribeOption) (k *omnibus.Consumer, cancel context.CancelFunc, done <-chan error) {
	markGoroutines(t)
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	wait, release := released()
	h := func(context.Context, *omnibus.Message) error {
		<-wait
		return nil
	}
	k = s.subscribe(t, sub, topic, h, append(earliest(sub), append([]omnibus.SubscribeOption{omnibus.Members(members)}, opts...)...)...)
	t.Cleanup(release) // before the consumer's Close
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done = start(ctx, k)
	// Keep publishing until every member holds a message: on some
	// transports a member gets lanes only when another gives them up.
	var last time.Time
	Eventually(t, timeout, func() bool {
		if len(busyMembers(k)) == members {
			return true
		}
		if time.Since(last) > 200*time.Millisecond {
			publishN(t, pub, topic, 20, 20, 8)
			last = time.Now()
		}
		return false
	}, func() string {
		return fmt.Sprintf("not every one of %d members got a message: %+v", members, k.Stats().Lanes)
	})
	return k, cancel, done
}

func checkUnsettled(t *testing.T, what string, err error) {
	t.Helper()
	var ue *omnibus.UnsettledError
	if !errors.As(err, &ue) || !errors.Is(err, context.DeadlineExceeded) || ue.Count == 0 {
		t.Errorf("%s with handlers running past its deadline: got %v, want an *UnsettledError counting them and wrapping context.DeadlineExceeded", what, err)
	}
}

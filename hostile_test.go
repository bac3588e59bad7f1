package omnibus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/membus"
)

// Tests that try to break the engine's promises the way a hostile user
// would: callbacks that call back in, handlers that ignore their context,
// dead-letter topics that refuse, one key failing for ever.

// faultConn is a membus connection whose publishes to some topics, commits
// and subscriber closes can be made to fail.
type faultConn struct {
	driver.Conn
	publish func(topic string) error // non-nil error: the publish fails
	commit  func() error
	leave   func() error
}

func (c *faultConn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if c.publish != nil {
		if err := c.publish(topic); err != nil {
			return err
		}
	}
	return c.Conn.Publish(ctx, topic, msgs, opts)
}

func (c *faultConn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	s, err := c.Conn.Subscribe(ctx, topic, opts)
	if err != nil {
		return nil, err
	}
	return &faultSub{Subscriber: s, c: c}, nil
}

type faultSub struct {
	driver.Subscriber
	c *faultConn
}

func (s *faultSub) Commit(ctx context.Context, ds []*driver.Delivery) error {
	if s.c.commit != nil {
		if err := s.c.commit(); err != nil {
			return err
		}
	}
	return s.Subscriber.(driver.Committer).Commit(ctx, ds)
}

func (s *faultSub) Close() error {
	err := s.Subscriber.Close()
	if s.c.leave != nil {
		err = errors.Join(err, s.c.leave())
	}
	return err
}

func openFault(t testing.TB, cfg membus.Config, fc *faultConn, opts ...omnibus.Option) *omnibus.Client {
	t.Helper()
	fc.Conn = membus.New(cfg).Conn()
	c, err := omnibus.New(fc, append([]omnibus.Option{quiet()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// keyOn returns a key that membus puts on partition p of n, distinct for
// each i.
func keyOn(p, n, i int) string {
	for j := 0; ; j++ {
		k := fmt.Sprintf("k%d-%d", i, j)
		if membus.Partition(k, n) == p {
			return k
		}
	}
}

// within fails t when fn does not return within d: a deadlock shows as a
// failure with every goroutine's stack, not as a hung test.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s did not return within %v (deadlock?)\n%s", what, d, buf[:runtime.Stack(buf, true)])
	}
}

// counter counts handled IDs.
type counter struct {
	mu  sync.Mutex
	ids map[string]int
}

func newCounter() *counter { return &counter{ids: map[string]int{}} }

func (c *counter) add(id string) {
	c.mu.Lock()
	c.ids[id]++
	c.mu.Unlock()
}

func (c *counter) count(ids []string) (seen int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if c.ids[id] > 0 {
			seen++
		}
	}
	return seen
}

func publishKeys(t testing.TB, c *omnibus.Client, topic string, keys ...string) []string {
	t.Helper()
	ms := make([]*omnibus.Message, len(keys))
	ids := make([]string, len(keys))
	for i, k := range keys {
		ms[i] = &omnibus.Message{Key: k, Body: []byte(strconv.Itoa(i))}
	}
	if err := c.Publish(context.Background(), topic, ms...); err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

// One key failing for ever must not stop the others: messages queued
// behind its retries do not count against MaxInFlight.
func TestRetryingKeyDoesNotStallOthers(t *testing.T) {
	c := openMem(t)
	seen := newCounter()
	k, err := c.Subscribe(context.Background(), "stall", func(ctx context.Context, m *omnibus.Message) error {
		if m.Key == "bad" {
			return errors.New("keeps failing")
		}
		seen.add(m.ID)
		return nil
	}, omnibus.MaxInFlight(2), omnibus.MaxAttempts(1000), omnibus.Backoff(100*time.Millisecond, 100*time.Millisecond),
		omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	bad := make([]string, 10)
	for i := range bad {
		bad[i] = "bad"
	}
	publishKeys(t, c, "stall", bad...)
	var good []string
	for i := range 50 {
		good = append(good, "good"+strconv.Itoa(i))
	}
	ids := publishKeys(t, c, "stall", good...)
	go k.Run(context.Background())
	defer k.Close()
	deadline := time.Now().Add(5 * time.Second)
	for seen.count(ids) < len(ids) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := seen.count(ids); n < len(ids) {
		t.Fatalf("%d of %d messages on other keys handled while one key retries", n, len(ids))
	}
}

// A revocation drains the revoked lanes only: the lanes that stay keep
// flowing while a slow message holds the drain.
func TestRevocationDoesNotPauseOtherLanes(t *testing.T) {
	c := openMem(t)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	slow := keyOn(3, 4, 0) // partition 3 moves to the second member
	var handled sync.Map
	k, err := c.Subscribe(context.Background(), "revoke", func(ctx context.Context, m *omnibus.Message) error {
		if m.Key == slow {
			select {
			case <-release:
			case <-time.After(3 * time.Second):
			}
		}
		handled.Store(m.ID, time.Now())
		return nil
	}, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.DrainTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	defer k.Close()
	publishKeys(t, c, "revoke", slow)
	waitFor(t, func() bool { return k.Stats().InFlight == 1 }, "the slow message to start")
	scaled := make(chan error, 1)
	go func() { scaled <- k.Scale(context.Background(), 2) }() // revokes partitions 2 and 3 of member 0
	time.Sleep(100 * time.Millisecond)                         // the revocation is draining now
	stay := publishKeys(t, c, "revoke", keyOn(0, 4, 1), keyOn(1, 4, 2), keyOn(0, 4, 3))
	sent := time.Now()
	waitFor(t, func() bool {
		for _, id := range stay {
			if _, ok := handled.Load(id); !ok {
				return false
			}
		}
		return true
	}, "messages on the lanes that stay")
	if d := time.Since(sent); d > time.Second {
		t.Errorf("messages on lanes that stay took %v during another lane's drain; want well under the drain", d)
	}
	free()
	if err := <-scaled; err != nil {
		t.Fatalf("Scale(2): %v", err)
	}
}

// MaxInFlightBytes is a bound: one small message first (a small average
// size) must not let a fetch of 200 large ones through.
func TestInFlightBytesBound(t *testing.T) {
	c := openFault(t, membus.Config{Partitions: 1}, &faultConn{})
	const bound, big = 1 << 20, 100 << 10
	release := make(chan struct{})
	var inflight, peak atomic.Int64
	k, err := c.Subscribe(context.Background(), "bytes", func(ctx context.Context, m *omnibus.Message) error {
		n := inflight.Add(int64(len(m.Body)))
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		inflight.Add(-int64(len(m.Body)))
		return nil
	}, omnibus.MaxInFlightBytes(bound), omnibus.Order(omnibus.OrderNone), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	ms := []*omnibus.Message{{Body: []byte("small")}}
	for range 200 {
		ms = append(ms, &omnibus.Message{Body: make([]byte, big)})
	}
	if err := c.Publish(context.Background(), "bytes", ms...); err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	defer k.Close()
	waitFor(t, func() bool { return inflight.Load() > big }, "large messages to start")
	time.Sleep(200 * time.Millisecond) // a fetch past the bound would land now
	if p := peak.Load(); p > bound {
		t.Errorf("%d bytes in flight at once, bound %d", p, bound)
	}
	close(release)
	waitFor(t, func() bool { return k.Stats().Processed == int64(len(ms)) }, "every message")
	if p := peak.Load(); p > bound {
		t.Errorf("%d bytes in flight at once, bound %d", p, bound)
	}
}

// A message larger than the whole bound still passes, alone.
func TestInFlightBytesOversizeAlone(t *testing.T) {
	c := openMem(t)
	var running, peak atomic.Int64
	k, err := c.Subscribe(context.Background(), "oversize", func(ctx context.Context, m *omnibus.Message) error {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return nil
	}, omnibus.MaxInFlightBytes(1000), omnibus.Order(omnibus.OrderNone), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	var ms []*omnibus.Message
	for range 20 {
		ms = append(ms, &omnibus.Message{Body: make([]byte, 5000)})
	}
	if err := c.Publish(context.Background(), "oversize", ms...); err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	defer k.Close()
	waitFor(t, func() bool { return k.Stats().Processed == 20 }, "every oversized message")
	if p := peak.Load(); p != 1 {
		t.Errorf("%d messages larger than the bound ran at once, want 1", p)
	}
}

// An observer may call back into the consumer, from every event,
// including the retries and commits emitted by the engine's own loops.
func TestObserverCallsBackIn(t *testing.T) {
	c := openMem(t)
	var kp atomic.Pointer[omnibus.Consumer]
	var events atomic.Int64
	var failed sync.Map
	k, err := c.Subscribe(context.Background(), "observer", func(ctx context.Context, m *omnibus.Message) error {
		if _, again := failed.LoadOrStore(m.ID, true); !again {
			return errors.New("fail once")
		}
		return nil
	}, omnibus.Observe(func(e omnibus.Event) {
		events.Add(1)
		if k := kp.Load(); k != nil {
			_ = k.Stats()
			_, _ = k.Lag(context.Background())
		}
	}), omnibus.Backoff(time.Millisecond, time.Millisecond), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	kp.Store(k)
	publishKeys(t, c, "observer", "a", "b", "c", "a", "b", "c")
	go k.Run(context.Background())
	within(t, 10*time.Second, "handling with an observer calling Stats and Lag", func() {
		for k.Stats().Processed < 6 {
			time.Sleep(5 * time.Millisecond)
		}
	})
	within(t, 10*time.Second, "Shutdown", func() {
		if err := k.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	if events.Load() == 0 {
		t.Error("no events observed")
	}
}

// Close, Shutdown and Scale called from a handler or an observer would
// wait for their caller: Close stops the consumer without waiting for it,
// Shutdown and Scale return ErrInvalid. None deadlocks.
func TestCallsFromInside(t *testing.T) {
	for _, call := range []string{"Close", "Shutdown", "Scale", "Client.Close", "observer Close", "observer Shutdown"} {
		t.Run(call, func(t *testing.T) {
			c := openMem(t)
			var kp atomic.Pointer[omnibus.Consumer]
			got := make(chan error, 1)
			inside := func() {
				k := kp.Load()
				var err error
				switch call {
				case "Close", "observer Close":
					err = k.Close()
				case "Shutdown", "observer Shutdown":
					err = k.Shutdown(context.Background())
				case "Scale":
					err = k.Scale(context.Background(), 2)
				case "Client.Close":
					err = c.Close()
				}
				select {
				case got <- err:
				default:
				}
			}
			var opts []omnibus.SubscribeOption
			if strings.HasPrefix(call, "observer") {
				opts = append(opts, omnibus.Observe(func(e omnibus.Event) {
					if e.Kind == omnibus.EventProcessed {
						inside()
					}
				}))
			}
			k, err := c.Subscribe(context.Background(), "inside", func(ctx context.Context, m *omnibus.Message) error {
				if !strings.HasPrefix(call, "observer") {
					inside()
				}
				return nil
			}, append(opts, omnibus.StartFrom(omnibus.StartEarliest))...)
			if err != nil {
				t.Fatal(err)
			}
			kp.Store(k)
			publishKeys(t, c, "inside", "a")
			go k.Run(context.Background())
			var inErr error
			within(t, 10*time.Second, call+" from inside", func() { inErr = <-got })
			switch call {
			case "Close", "observer Close", "Client.Close":
				if inErr != nil {
					t.Errorf("%s from inside: %v, want nil", call, inErr)
				}
				within(t, 10*time.Second, "the consumer to stop", func() { <-k.Done() })
			default:
				if !errors.Is(inErr, omnibus.ErrInvalid) {
					t.Errorf("%s from inside: %v, want ErrInvalid", call, inErr)
				}
				within(t, 10*time.Second, "Close from outside", func() { k.Close() })
			}
		})
	}
}

// Shutdown returns by its deadline even when a handler ignores its
// context, and so do Run's drain and Scale.
func TestShutdownIgnoredContext(t *testing.T) {
	for _, how := range []string{"Shutdown", "Run", "Scale"} {
		t.Run(how, func(t *testing.T) {
			c := openMem(t)
			stuck := make(chan struct{})
			defer close(stuck) // let the handler end, for goleak
			started := make(chan struct{}, 100)
			k, err := c.Subscribe(context.Background(), "ignore", func(ctx context.Context, m *omnibus.Message) error {
				started <- struct{}{}
				<-stuck // ignores ctx
				return nil
			}, omnibus.StartFrom(omnibus.StartEarliest), omnibus.DrainTimeout(200*time.Millisecond), omnibus.Group("g"))
			if err != nil {
				t.Fatal(err)
			}
			if how == "Scale" {
				if err := k.Scale(context.Background(), 2); err != nil {
					t.Fatal(err)
				}
			}
			var keys []string
			for i := range 4 {
				keys = append(keys, keyOn(i, 4, i))
			}
			publishKeys(t, c, "ignore", keys...)
			rctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- k.Run(rctx) }()
			for range 4 {
				<-started
			}
			var err2 error
			begin := time.Now()
			within(t, 10*time.Second, how, func() {
				switch how {
				case "Shutdown":
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					defer cancel()
					err2 = k.Shutdown(ctx)
				case "Run":
					cancel()
					err2 = <-ran
				case "Scale":
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					defer cancel()
					err2 = k.Scale(ctx, 1)
				}
			})
			if d := time.Since(begin); d > 3*time.Second {
				t.Errorf("%s took %v with a 200ms bound", how, d)
			}
			var ue *omnibus.UnsettledError
			if !errors.As(err2, &ue) || ue.Count == 0 {
				t.Errorf("%s: %v, want an *UnsettledError", how, err2)
			}
		})
	}
}

// Shutdown reports a final commit that failed, and Close a failure to
// leave the group.
func TestShutdownReportsFailures(t *testing.T) {
	injected := errors.New("injected commit failure")
	var failCommits atomic.Bool
	fc := &faultConn{commit: func() error {
		if failCommits.Load() {
			return injected
		}
		return nil
	}}
	c := openFault(t, membus.Config{Partitions: 2}, fc)
	k, err := c.Subscribe(context.Background(), "commit", func(ctx context.Context, m *omnibus.Message) error { return nil },
		omnibus.StartFrom(omnibus.StartEarliest), omnibus.CommitInterval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	failCommits.Store(true)
	publishKeys(t, c, "commit", "a", "b", "c")
	waitFor(t, func() bool { return k.Stats().Processed == 3 }, "three messages")
	if err := k.Shutdown(context.Background()); !errors.Is(err, injected) {
		t.Errorf("Shutdown after a failed final commit: %v, want it reported", err)
	}

	left := errors.New("injected leave failure")
	fc2 := &faultConn{leave: func() error { return left }}
	c2 := openFault(t, membus.Config{Partitions: 2}, fc2)
	k2, err := c2.Subscribe(context.Background(), "leave", func(ctx context.Context, m *omnibus.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := k2.Close(); !errors.Is(err, left) {
		t.Errorf("Close after leaving the group failed: %v, want it reported", err)
	}
}

// logCounter counts log records at ERROR.
type logCounter struct{ errors atomic.Int64 }

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		l.errors.Add(1)
	}
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

// A dead letter that can never land (the reason headers push a message
// near the size limit over it) holds its own key only: the other keys
// flow, the message is not settled (a new consumer of the group gets it
// again), and the engine does not log in a tight loop.
func TestDeadLetterRefused(t *testing.T) {
	const limit = 4096
	logs := &logCounter{}
	fc := &faultConn{}
	c := openFault(t, membus.Config{Partitions: 4, MaxBytes: limit}, fc, omnibus.WithLogger(slog.New(logs)))
	poison := &omnibus.Message{Key: "poison", Body: bytes.Repeat([]byte("p"), limit-64)}
	if err := c.Publish(context.Background(), "refuse", poison); err != nil {
		t.Fatal(err)
	}
	var keys, behind []string
	for i := range 500 {
		keys = append(keys, "k"+strconv.Itoa(i%50))
		if i%5 == 0 {
			behind = append(behind, "poison") // held behind it, in order
		}
	}
	publishKeys(t, c, "refuse", behind...)
	ids := publishKeys(t, c, "refuse", keys...)
	seen := newCounter()
	k, err := c.Subscribe(context.Background(), "refuse", func(ctx context.Context, m *omnibus.Message) error {
		if m.ID == poison.ID {
			return omnibus.Permanent(errors.New("cannot parse"))
		}
		seen.add(m.ID)
		return nil
	}, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(64),
		omnibus.Backoff(10*time.Millisecond, 300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	waitFor(t, func() bool { return seen.count(ids) == len(ids) }, fmt.Sprintf("%d healthy messages on other keys", len(ids)))
	time.Sleep(time.Second)
	if n := logs.errors.Load(); n > 20 {
		t.Errorf("%d ERROR records in about a second: a tight loop", n)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	// Not settled: the group's next consumer gets it again.
	again := make(chan string, 1)
	k2, err := c.Subscribe(context.Background(), "refuse", func(ctx context.Context, m *omnibus.Message) error {
		if m.ID == poison.ID {
			select {
			case again <- m.ID:
			default:
			}
		}
		return nil
	}, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	go k2.Run(context.Background())
	defer k2.Close()
	select {
	case id := <-again:
		if id != poison.ID {
			t.Errorf("redelivered %s, want %s", id, poison.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a dead letter that never landed was settled: the group never saw it again")
	}
}

// A dead letter whose reason alone pushes it over the size limit lands
// with its reason cut.
func TestDeadLetterReasonTrimmed(t *testing.T) {
	const limit = 4096
	c := openFault(t, membus.Config{Partitions: 1, MaxBytes: limit}, &faultConn{})
	dead := make(chan *omnibus.Message, 1)
	kd, err := c.Subscribe(context.Background(), "trim.dlq", func(ctx context.Context, m *omnibus.Message) error {
		cp := *m
		cp.Headers = maps.Clone(m.Headers)
		dead <- &cp
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	go kd.Run(context.Background())
	defer kd.Close()
	k, err := c.Subscribe(context.Background(), "trim", func(ctx context.Context, m *omnibus.Message) error {
		return omnibus.Permanent(errors.New(strings.Repeat("a long reason ", 200)))
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	defer k.Close()
	m := &omnibus.Message{Key: "x", Body: bytes.Repeat([]byte("b"), limit/2)}
	if err := c.Publish(context.Background(), "trim", m); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-dead:
		r := d.Headers[omnibus.HeaderDeadReason]
		if d.ID != m.ID || r == "" || len(r) >= 2800 || !strings.HasPrefix(r, "a long reason") {
			t.Errorf("dead letter %s reason %d bytes %.40q; want %s with its reason cut to fit", d.ID, len(r), r, m.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dead letter never landed")
	}
}

// Dead letters are published under the lane's context: once the lane has
// moved to another member, the old one stops dead-lettering it, so the
// dead-letter topic gets one copy.
func TestDeadLetterStopsWithLane(t *testing.T) {
	var refuse atomic.Bool
	refuse.Store(true)
	fc := &faultConn{publish: func(topic string) error {
		if strings.HasSuffix(topic, ".dlq") && refuse.Load() {
			return fmt.Errorf("dead-letter topic unavailable: %w", driver.ErrRetryable)
		}
		return nil
	}}
	c := openFault(t, membus.Config{Partitions: 2}, fc)
	poisonKey := keyOn(1, 2, 0) // partition 1 moves to the second member
	k, err := c.Subscribe(context.Background(), "moving", func(ctx context.Context, m *omnibus.Message) error {
		return omnibus.Permanent(errors.New("poison"))
	}, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.DrainTimeout(300*time.Millisecond),
		omnibus.Backoff(20*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	defer k.Close()
	ids := publishKeys(t, c, "moving", poisonKey)
	time.Sleep(200 * time.Millisecond) // member 0 is trying to dead-letter it
	if err := k.Scale(context.Background(), 2); err != nil {
		var ue *omnibus.UnsettledError
		if !errors.As(err, &ue) {
			t.Fatalf("Scale(2): %v", err)
		}
	}
	time.Sleep(200 * time.Millisecond) // member 1 tries too
	refuse.Store(false)
	dead := newCounter()
	kd, err := c.Subscribe(context.Background(), "moving.dlq", func(ctx context.Context, m *omnibus.Message) error {
		dead.add(m.ID)
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	go kd.Run(context.Background())
	defer kd.Close()
	waitFor(t, func() bool { return dead.count(ids) == 1 }, "the dead letter")
	time.Sleep(500 * time.Millisecond) // a second copy would land now
	dead.mu.Lock()
	defer dead.mu.Unlock()
	if n := dead.ids[ids[0]]; n != 1 {
		t.Errorf("dead-lettered %d times after its lane moved, want once", n)
	}
}

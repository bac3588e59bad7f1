package omnibus_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/membus"
)

// ledger records what handlers finished, and checks every commit the
// engine makes against it: a committed position must never be past a
// message whose handler has not succeeded or which was not dead-lettered.
type ledger struct {
	t  testing.TB
	mu sync.Mutex
	// settled[lane][offset] is true once the message is done.
	settled    map[string]map[int64]bool
	checked    map[string]int64 // per lane: offsets below are verified
	violations []string
	commitErrs []error
	commits    int
}

func newLedger(t testing.TB) *ledger {
	return &ledger{t: t, settled: map[string]map[int64]bool{}, checked: map[string]int64{}}
}

func (l *ledger) settle(m *omnibus.Message) {
	off, err := strconv.ParseInt(m.Position, 10, 64)
	if err != nil {
		l.t.Errorf("position %q is not an offset", m.Position)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settled[m.Lane] == nil {
		l.settled[m.Lane] = map[int64]bool{}
	}
	l.settled[m.Lane][off] = true
}

func (l *ledger) commit(ds []*driver.Delivery, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.commits++
	if err != nil {
		l.commitErrs = append(l.commitErrs, err)
	}
	for _, d := range ds {
		upTo, perr := strconv.ParseInt(d.Position, 10, 64)
		if perr != nil {
			l.violations = append(l.violations, fmt.Sprintf("lane %s: position %q: %v", d.Lane, d.Position, perr))
			return
		}
		for off := l.checked[d.Lane]; off <= upTo; off++ {
			if !l.settled[d.Lane][off] {
				l.violations = append(l.violations, fmt.Sprintf("lane %s committed through %d but %d is not settled", d.Lane, upTo, off))
				return
			}
		}
		l.checked[d.Lane] = max(l.checked[d.Lane], upTo+1)
	}
}

func (l *ledger) verify(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.violations) > 0 {
		t.Errorf("watermark passed unsettled messages: %v", l.violations[:min(5, len(l.violations))])
	}
	if len(l.commitErrs) > 0 {
		t.Errorf("%d commits failed (a commit after revocation?): %v", len(l.commitErrs), l.commitErrs[0])
	}
	if l.commits == 0 {
		t.Error("nothing was committed")
	}
}

// checkedConn wraps a membus connection so every commit goes through the
// ledger.
type checkedConn struct {
	driver.Conn
	topic string
	l     *ledger
}

func (c checkedConn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	s, err := c.Conn.Subscribe(ctx, topic, opts)
	if err != nil || topic != c.topic {
		return s, err
	}
	return checkedSub{s, c.l}, nil
}

type checkedSub struct {
	driver.Subscriber
	l *ledger
}

func (s checkedSub) Commit(ctx context.Context, ds []*driver.Delivery) error {
	err := s.Subscriber.(driver.Committer).Commit(ctx, ds)
	if err == nil {
		s.l.commit(ds, nil)
	} else {
		s.l.commit(nil, err)
	}
	return err
}

func (s checkedSub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	return s.Subscriber.(driver.LagReader).Lag(ctx)
}

// fault decides, from a message's ID, how the test handler treats it.
type fault int

const (
	faultNone fault = iota
	faultErrorOnce
	faultPanicOnce
	faultSlow
	faultPoison    // fails every attempt: dead-lettered after MaxAttempts
	faultPermanent // dead-lettered at once
)

func faultOf(id string) fault {
	h := fnv.New32a()
	h.Write([]byte(id))
	switch v := h.Sum32() % 1000; {
	case v < 50:
		return faultErrorOnce
	case v < 70:
		return faultPanicOnce
	case v < 80:
		return faultSlow
	case v < 85:
		return faultPoison
	case v < 88:
		return faultPermanent
	}
	return faultNone
}

// TestEngineFaults runs 10,000 messages through each ordering mode with
// injected handler errors, panics, slow handlers, a member leaving
// mid-stream and a shutdown mid-stream, and counts unique IDs.
func TestEngineFaults(t *testing.T) {
	for _, mode := range []omnibus.Ordering{omnibus.OrderLane, omnibus.OrderKey, omnibus.OrderNone} {
		t.Run(mode.String(), func(t *testing.T) { testEngineFaults(t, mode) })
	}
}

func testEngineFaults(t *testing.T, mode omnibus.Ordering) {
	const n, keys = 10000, 200
	ctx := context.Background()
	bus := membus.New(membus.Config{Partitions: 8})
	led := newLedger(t)
	const topic = "orders"
	c, err := omnibus.New(checkedConn{bus.Conn(), topic, led}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateTopic(ctx, topic, 8); err != nil {
		t.Fatal(err)
	}

	// The dead-letter reader.
	var dmu sync.Mutex
	dead := map[string]map[string]string{}
	deadCount := map[string]int{}
	kd, err := c.Subscribe(ctx, topic+".dlq", func(ctx context.Context, m *omnibus.Message) error {
		dmu.Lock()
		defer dmu.Unlock()
		deadCount[m.ID]++
		dead[m.ID] = maps.Clone(m.Headers)
		return nil
	}, omnibus.Group("dlq"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	go kd.Run(ctx)
	defer kd.Close()

	var mu sync.Mutex
	done := map[string]int{}
	seqs := map[string][]int{} // successes per key, in order
	attempts := map[string]int{}
	var failedOnce sync.Map
	handler := func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		attempts[m.ID]++
		mu.Unlock()
		switch faultOf(m.ID) {
		case faultErrorOnce:
			if _, loaded := failedOnce.LoadOrStore(m.ID, true); !loaded {
				return errors.New("injected error")
			}
		case faultPanicOnce:
			if _, loaded := failedOnce.LoadOrStore(m.ID, true); !loaded {
				panic("injected panic")
			}
		case faultSlow:
			time.Sleep(5 * time.Millisecond)
		case faultPoison:
			return errors.New("poison")
		case faultPermanent:
			return omnibus.Permanent(errors.New("undecodable"))
		}
		seq, _ := strconv.Atoi(m.Headers["seq"])
		mu.Lock()
		done[m.ID]++
		seqs[m.Key] = append(seqs[m.Key], seq)
		mu.Unlock()
		led.settle(m)
		return nil
	}
	opts := []omnibus.SubscribeOption{
		omnibus.Group("workers"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(mode),
		omnibus.MaxInFlight(64), omnibus.MaxAttempts(3), omnibus.Backoff(time.Millisecond, 10*time.Millisecond),
		omnibus.Observe(func(e omnibus.Event) {
			if e.Kind == omnibus.EventDeadLettered {
				led.settle(e.Message)
			}
		}),
	}

	// Publish everything, with a sequence number per key.
	ids := make([]string, 0, n)
	for i := 0; i < n; i += 500 {
		var ms []*omnibus.Message
		for j := i; j < i+500; j++ {
			ms = append(ms, &omnibus.Message{Key: "customer-" + strconv.Itoa(j%keys), Headers: map[string]string{"seq": strconv.Itoa(j / keys)}, Body: []byte("order")})
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
	}
	progress := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(done)
	}

	// Three members; one leaves at a quarter; the consumer shuts down at half.
	k1, err := c.Subscribe(ctx, topic, handler, append(opts, omnibus.Members(3))...)
	if err != nil {
		t.Fatal(err)
	}
	go k1.Run(ctx)
	waitFor(t, func() bool { return progress() >= n/4 }, "a quarter processed")
	if err := k1.Scale(ctx, 2); err != nil {
		t.Fatalf("Scale(2): %v", err)
	}
	waitFor(t, func() bool { return progress() >= n/2 }, "half processed")
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := k1.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}

	// A new consumer of the same group finishes the work.
	k2, err := c.Subscribe(ctx, topic, handler, append(opts, omnibus.Members(2))...)
	if err != nil {
		t.Fatal(err)
	}
	go k2.Run(ctx)
	defer k2.Close()

	var poison []string
	for _, id := range ids {
		if f := faultOf(id); f == faultPoison || f == faultPermanent {
			poison = append(poison, id)
		}
	}
	want := n - len(poison)
	waitFor(t, func() bool {
		dmu.Lock()
		defer dmu.Unlock()
		return progress() == want && len(deadCount) == len(poison)
	}, "every message processed or dead-lettered")
	if err := k2.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	led.verify(t)

	mu.Lock()
	defer mu.Unlock()
	dmu.Lock()
	defer dmu.Unlock()
	for _, id := range ids {
		f := faultOf(id)
		isPoison := f == faultPoison || f == faultPermanent
		switch {
		case isPoison && done[id] > 0:
			t.Errorf("poison %s was processed", id)
		case isPoison && deadCount[id] != 1:
			t.Errorf("poison %s dead-lettered %d times, want once", id, deadCount[id])
		case !isPoison && done[id] == 0:
			t.Errorf("message %s lost", id)
		case !isPoison && deadCount[id] > 0:
			t.Errorf("message %s dead-lettered", id)
		}
		if isPoison && deadCount[id] == 1 {
			h := dead[id]
			wantAttempts := "3"
			if f == faultPermanent {
				wantAttempts = "1"
			}
			if h[omnibus.HeaderDeadAttempts] != wantAttempts || h[omnibus.HeaderDeadTopic] != topic || h[omnibus.HeaderDeadGroup] != "workers" ||
				h[omnibus.HeaderDeadLane] == "" || h[omnibus.HeaderDeadPosition] == "" || h[omnibus.HeaderDeadReason] == "" ||
				h[omnibus.HeaderDeadFirstFailure] == "" || h[omnibus.HeaderDeadLastFailure] == "" || h["seq"] == "" {
				t.Errorf("dead letter %s headers %v", id, h)
			}
		}
	}
	if mode == omnibus.OrderNone {
		return
	}
	for key, s := range seqs {
		for i := 1; i < len(s); i++ {
			// Going back is a redelivery after a rebalance or restart, which
			// replays from the committed position: allowed only to a
			// sequence already handled.
			if s[i] <= s[i-1] && !slices.Contains(s[:i], s[i]) {
				t.Fatalf("key %s handled out of order: %v", key, s[max(0, i-5):min(len(s), i+3)])
			}
		}
	}
}

func waitFor(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBatchIsWhatHasArrived: with Batch's default period (0) a batch is
// what its key holds when a worker takes it: a first message runs alone,
// and what arrives while its batch runs makes the next batch, whole, not
// one message at a time.
func TestBatchIsWhatHasArrived(t *testing.T) {
	ctx := context.Background()
	c := openMem(t)
	started, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	k, err := c.SubscribeBatch(ctx, "arrived", func(ctx context.Context, ms []*omnibus.Message) error {
		mu.Lock()
		sizes = append(sizes, len(ms))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			close(started)
			<-release
		}
		return nil
	}, omnibus.Order(omnibus.OrderKey), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	defer k.Close()
	if err := c.Publish(ctx, "arrived", &omnibus.Message{Key: "k"}); err != nil {
		t.Fatal(err)
	}
	<-started
	var more []*omnibus.Message
	for range 5 {
		more = append(more, &omnibus.Message{Key: "k"})
	}
	if err := c.Publish(ctx, "arrived", more...); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the five reach the key's queue behind the running batch
	close(release)
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 2 }, "the second batch")
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sizes, []int{1, 5}) {
		t.Errorf("batch sizes %v, want [1 5]: the first message alone, then what arrived meanwhile", sizes)
	}
}

func TestBatches(t *testing.T) {
	ctx := context.Background()
	c := openMem(t)
	var mu sync.Mutex
	var sizes []int
	got := map[string]int{}
	var failedOnce atomic.Bool
	k, err := c.SubscribeBatch(ctx, "batches", func(ctx context.Context, ms []*omnibus.Message) error {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(ms))
		errs := make([]error, len(ms))
		for i, m := range ms {
			if m.Headers["fail"] == "once" && failedOnce.CompareAndSwap(false, true) {
				errs[i] = errors.New("injected")
				continue
			}
			got[m.ID]++
		}
		return &omnibus.BatchError{Errs: errs}
	}, omnibus.Batch(10, 2500, 30*time.Millisecond), omnibus.Order(omnibus.OrderLane), omnibus.Backoff(time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	defer k.Close()
	time.Sleep(50 * time.Millisecond)

	// Three small messages on one lane flush on the period, as one batch.
	var three []*omnibus.Message
	for range 3 {
		three = append(three, &omnibus.Message{Key: "k", Body: []byte("x")})
	}
	if err := c.Publish(ctx, "batches", three...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 3 }, "three messages")
	mu.Lock()
	if !slices.Equal(sizes, []int{3}) {
		t.Errorf("batch sizes %v, want one batch of 3 flushed by the period", sizes)
	}
	sizes = nil
	mu.Unlock()

	// 1000-byte messages flush at 2 per batch (bytes); small ones at 10 (count).
	var ms []*omnibus.Message
	for i := range 40 {
		body := []byte("x")
		if i < 10 {
			body = make([]byte, 1000)
		}
		ms = append(ms, &omnibus.Message{Key: "k", Body: body, Headers: map[string]string{}})
	}
	ms[25].Headers["fail"] = "once"
	if err := c.Publish(ctx, "batches", ms...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 43 }, "all batched messages")
	mu.Lock()
	defer mu.Unlock()
	for _, s := range sizes {
		if s > 10 {
			t.Errorf("batch of %d, over the count of 10: %v", s, sizes)
		}
	}
	if sizes[0] > 2 {
		t.Errorf("first batch of 1000-byte messages has %d, want at most 2 (2500 bytes): %v", sizes[0], sizes)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("%s handled %d times in batches", id, n)
		}
	}
}

func TestShutdownDeadline(t *testing.T) {
	ctx := context.Background()
	c := openMem(t)
	started := make(chan struct{}, 10)
	k, err := c.Subscribe(ctx, "stuck", func(ctx context.Context, m *omnibus.Message) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "stuck", &omnibus.Message{Key: "a"}, &omnibus.Message{Key: "b"}); err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	<-started
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err = k.Shutdown(sctx)
	var ue *omnibus.UnsettledError
	if !errors.As(err, &ue) || ue.Count == 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown past its deadline: got %v, want an UnsettledError wrapping DeadlineExceeded", err)
	}
	if err := k.Shutdown(ctx); !errors.Is(err, omnibus.ErrClosed) {
		t.Errorf("second Shutdown: %v, want ErrClosed", err)
	}
}

func TestRunTwice(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := openMem(t)
	k, err := c.Subscribe(ctx, "t", func(context.Context, *omnibus.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- k.Run(ctx) }()
	time.Sleep(10 * time.Millisecond)
	if err := k.Run(ctx); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("second Run: %v, want ErrInvalid", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// In OrderKey, batches form per key: a batch never mixes keys, and each
// key's messages arrive in order across its batches.
func TestBatchesPerKey(t *testing.T) {
	ctx := context.Background()
	c := openMem(t)
	var mu sync.Mutex
	seqs := map[string][]int{}
	total := 0
	k, err := c.SubscribeBatch(ctx, "keyed", func(ctx context.Context, ms []*omnibus.Message) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			if m.Key != ms[0].Key {
				t.Errorf("a batch mixes keys %q and %q", ms[0].Key, m.Key)
			}
			n, _ := strconv.Atoi(string(m.Body))
			seqs[m.Key] = append(seqs[m.Key], n)
			total++
		}
		return nil
	}, omnibus.Batch(7, 1<<20, 5*time.Millisecond), omnibus.Order(omnibus.OrderKey), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	var ms []*omnibus.Message
	for i := range 300 {
		ms = append(ms, &omnibus.Message{Key: "k" + strconv.Itoa(i%5), Body: []byte(strconv.Itoa(i / 5))})
	}
	if err := c.Publish(ctx, "keyed", ms...); err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	defer k.Close()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return total == 300 }, "every batched message")
	mu.Lock()
	defer mu.Unlock()
	for key, s := range seqs {
		for i, n := range s {
			if n != i {
				t.Fatalf("key %s out of order across batches: %v", key, s)
			}
		}
	}
}

// A partial batch does not wait for more while no more can come: with
// MaxInFlight messages held, each of its own key, the fetch loop waits for
// room, so the batches go at once rather than after their period (ten
// minutes here, past waitFor's minute).
func TestBatchesDoNotWaitAtTheBound(t *testing.T) {
	ctx := context.Background()
	c := openMem(t)
	var handled atomic.Int64
	k, err := c.SubscribeBatch(ctx, "bound", func(ctx context.Context, ms []*omnibus.Message) error {
		handled.Add(int64(len(ms)))
		return nil
	}, omnibus.Batch(100, 1<<20, 10*time.Minute), omnibus.MaxInFlight(8), omnibus.Order(omnibus.OrderKey), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	var ms []*omnibus.Message
	for i := range 64 {
		ms = append(ms, &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte("x")})
	}
	if err := c.Publish(ctx, "bound", ms...); err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	defer k.Close()
	// The last ones may wait their period: the transport could still
	// deliver more of their keys.
	waitFor(t, func() bool { return handled.Load() >= 64-8 }, "56 of 64 messages of 64 keys, 8 in flight at most")
}

// MaxInFlight and MaxInFlightBytes bound what is received and unsettled:
// with handlers that never finish, the engine stops fetching at the bound.
func TestInFlightBounds(t *testing.T) {
	for _, tt := range []struct {
		name string
		opt  omnibus.SubscribeOption
		want int // most messages in flight
	}{
		{"messages", omnibus.MaxInFlight(5), 5},
		{"bytes", omnibus.MaxInFlightBytes(10_000), 10}, // 1 KiB bodies
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			c := openMem(t)
			release := make(chan struct{})
			var running, peak atomic.Int64
			k, err := c.Subscribe(ctx, "bounded", func(ctx context.Context, m *omnibus.Message) error {
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				select {
				case <-release:
				case <-ctx.Done():
				}
				running.Add(-1)
				return nil
			}, tt.opt, omnibus.Order(omnibus.OrderNone), omnibus.StartFrom(omnibus.StartEarliest))
			if err != nil {
				t.Fatal(err)
			}
			var ms []*omnibus.Message
			for range 300 {
				ms = append(ms, &omnibus.Message{Body: make([]byte, 1024)})
			}
			if err := c.Publish(ctx, "bounded", ms...); err != nil {
				t.Fatal(err)
			}
			go k.Run(ctx)
			defer k.Close()
			waitFor(t, func() bool { return running.Load() > 0 }, "handlers to start")
			time.Sleep(100 * time.Millisecond) // a fetch past the bound would land now
			if got := k.Stats().InFlight; got > tt.want || peak.Load() > int64(tt.want) {
				t.Errorf("in flight %d, handlers at once %d; want at most %d", got, peak.Load(), tt.want)
			}
			close(release)
		})
	}
}

// The worker pool grows with the backlog, as a goroutine per slot would:
// 40 slots whose handlers all wait for one another run at once. Once the
// work is done, idle workers beyond max(4, GOMAXPROCS) end.
func TestWorkersGrowAndEnd(t *testing.T) {
	const slots = 40
	for _, mode := range []omnibus.Ordering{omnibus.OrderNone, omnibus.OrderKey} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			c := openMem(t)
			release := make(chan struct{})
			var running atomic.Int64
			k, err := c.Subscribe(ctx, "pool", func(ctx context.Context, m *omnibus.Message) error {
				running.Add(1)
				defer running.Add(-1)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, omnibus.Order(mode), omnibus.StartFrom(omnibus.StartEarliest))
			if err != nil {
				t.Fatal(err)
			}
			var ms []*omnibus.Message
			for i := range slots {
				ms = append(ms, &omnibus.Message{Key: "k" + strconv.Itoa(i)})
			}
			if err := c.Publish(ctx, "pool", ms...); err != nil {
				t.Fatal(err)
			}
			go k.Run(ctx)
			defer k.Close()
			waitFor(t, func() bool { return running.Load() == slots }, "every slot's handler running at once")
			busy := runtime.NumGoroutine()
			close(release)
			idle := max(4, runtime.GOMAXPROCS(0))
			waitFor(t, func() bool { return k.Stats().Processed == slots && runtime.NumGoroutine() <= busy-(slots-idle) },
				fmt.Sprintf("idle workers to end (goroutines %d while busy, want at most %d)", busy, busy-(slots-idle)))
		})
	}
}

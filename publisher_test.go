package omnibus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/membus"
)

// gateConn is a membus connection whose publishes wait for the gate to
// open (or their ctx to end).
type gateConn struct {
	driver.Conn
	gate chan struct{}
}

func (g *gateConn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return fmt.Errorf("gate: %w: %w", driver.ErrOutcomeUnknown, ctx.Err())
	}
	return g.Conn.Publish(ctx, topic, msgs, opts)
}

func gatedClient(t *testing.T) (*omnibus.Client, *gateConn) {
	t.Helper()
	g := &gateConn{Conn: membus.New(membus.Config{Partitions: 1}).Conn(), gate: make(chan struct{})}
	c, err := omnibus.New(g, omnibus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, g
}

func newPublisher(t *testing.T, c *omnibus.Client, opts ...omnibus.PublisherOption) *omnibus.Publisher {
	t.Helper()
	p, err := c.Publisher(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

// TestPublisherKeyOrderAndBatches: 5,000 messages over 20 keys from one
// goroutine all land once, each key's in the order given, in batches.
func TestPublisherKeyOrderAndBatches(t *testing.T) {
	c, fc, _, _ := flakyClient(t, func(int, int) error { return nil })
	p := newPublisher(t, c, omnibus.Linger(5*time.Millisecond))
	const n, keys = 5000, 20
	results := make([]*omnibus.PublishResult, n)
	for i := range n {
		r, err := p.Publish(context.Background(), "t", &omnibus.Message{Key: "k" + strconv.Itoa(i%keys), Body: []byte(strconv.Itoa(i))})
		if err != nil {
			t.Fatal(err)
		}
		results[i] = r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	byID := map[string]int{}
	for i, r := range results {
		if err := r.Err(); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		byID[r.ID()] = i
	}
	calls := fc.calls()
	seen := map[int]bool{}
	last := map[int]int{} // key -> last message number
	for _, ids := range calls {
		for _, id := range ids {
			i, ok := byID[id]
			if !ok || seen[i] {
				t.Fatalf("id %q: unknown or sent twice", id)
			}
			seen[i] = true
			if l, ok := last[i%keys]; ok && l > i {
				t.Fatalf("key k%d: message %d sent after %d", i%keys, i, l)
			}
			last[i%keys] = i
		}
	}
	if len(seen) != n {
		t.Fatalf("%d of %d sent", len(seen), n)
	}
	if len(calls) > n/10 {
		t.Errorf("%d driver publishes for %d messages: not batched", len(calls), n)
	}
	t.Logf("%d messages in %d batches", n, len(calls))
}

// TestPublisherRidesThrough: a batch failing with ErrRetryable is
// published again with the same IDs; every result ends nil and every
// message is stored once.
func TestPublisherRidesThrough(t *testing.T) {
	c, fc, rc, _ := flakyClient(t, func(try, i int) error {
		if try <= 2 {
			return fmt.Errorf("connection reset: %w", driver.ErrRetryable)
		}
		return nil
	})
	p := newPublisher(t, c, omnibus.Senders(1))
	var results []*omnibus.PublishResult
	for i := range 100 {
		r, err := p.Publish(context.Background(), "t", &omnibus.Message{Key: "k", Body: []byte(strconv.Itoa(i))})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, r := range results {
		if err := r.Get(ctx); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if len(rc.retries) == 0 {
		t.Fatal("no retry seen by the hook")
	}
	stored := map[string]int{}
	for try, ids := range fc.calls() {
		if try < 2 {
			continue // failed with ErrRetryable: not stored
		}
		for _, id := range ids {
			stored[id]++
		}
	}
	for i, r := range results {
		if stored[r.ID()] != 1 {
			t.Fatalf("message %d stored %d times", i, stored[r.ID()])
		}
	}
}

// TestPublisherBufferBound: past MaxBuffered, Publish fails with ErrFull
// (FailWhenFull) or waits for room until its ctx ends; what was taken
// lands once the transport answers.
func TestPublisherBufferBound(t *testing.T) {
	for _, fail := range []bool{true, false} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			c, g := gatedClient(t)
			opts := []omnibus.PublisherOption{omnibus.MaxBuffered(10, 1<<20)}
			if fail {
				opts = append(opts, omnibus.FailWhenFull())
			}
			p := newPublisher(t, c, opts...)
			var results []*omnibus.PublishResult
			for i := range 10 {
				r, err := p.Publish(context.Background(), "t", &omnibus.Message{Key: strconv.Itoa(i)})
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				results = append(results, r)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := p.Publish(ctx, "t", &omnibus.Message{})
			if want := map[bool]error{true: omnibus.ErrFull, false: context.DeadlineExceeded}[fail]; !errors.Is(err, want) {
				t.Fatalf("11th publish: %v, want %v", err, want)
			}
			select {
			case <-results[0].Ready():
				t.Fatal("a result was ready before the transport answered")
			default:
			}
			close(g.gate)
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := p.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for i, r := range results {
				if err := r.Err(); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
		})
	}
}

// TestPublisherContextEndsBeforeSend: a message whose ctx ends while it
// waits behind its key's batch in flight is not sent, and says why.
func TestPublisherContextEndsBeforeSend(t *testing.T) {
	c, g := gatedClient(t)
	p := newPublisher(t, c, omnibus.Senders(1))
	first, err := p.Publish(context.Background(), "t", &omnibus.Message{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the first batch leaves alone
	ctx, cancel := context.WithCancel(context.Background())
	second, err := p.Publish(ctx, "t", &omnibus.Message{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	close(g.gate)
	wait, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	if err := first.Get(wait); err != nil {
		t.Fatalf("first: %v", err)
	}
	if err := second.Get(wait); !errors.Is(err, context.Canceled) {
		t.Fatalf("second: %v, want context.Canceled", err)
	}
}

// TestPublisherClose: Close publishes what is held and then refuses
// messages; a Close whose ctx ends fails what is in flight and returns.
func TestPublisherClose(t *testing.T) {
	t.Run("flushes", func(t *testing.T) {
		c, _, _, _ := flakyClient(t, func(int, int) error { return nil })
		p := newPublisher(t, c, omnibus.Linger(time.Hour))
		r, err := p.Publish(context.Background(), "t", &omnibus.Message{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Publish(context.Background(), "t", &omnibus.Message{}); !errors.Is(err, omnibus.ErrClosed) {
			t.Fatalf("publish after Close: %v", err)
		}
	})
	t.Run("ctx ends", func(t *testing.T) {
		c, _ := gatedClient(t) // never opens
		p := newPublisher(t, c)
		r, err := p.Publish(context.Background(), "t", &omnibus.Message{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close: %v", err)
		}
		select {
		case <-r.Ready():
		default:
			t.Fatal("Close returned with a result not ready")
		}
		if err := r.Err(); !errors.Is(err, omnibus.ErrOutcomeUnknown) {
			t.Fatalf("in-flight message: %v, want ErrOutcomeUnknown", err)
		}
	})
}

// TestPublisherConcurrent: 8 goroutines publishing at once under -race;
// every message lands once.
func TestPublisherConcurrent(t *testing.T) {
	c, fc, _, _ := flakyClient(t, func(int, int) error { return nil })
	p := newPublisher(t, c)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var results []*omnibus.PublishResult
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				r, err := p.Publish(context.Background(), "t", &omnibus.Message{Key: strconv.Itoa(i % 7), Body: []byte(strconv.Itoa(g*1000 + i))})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sent := map[string]int{}
	for _, ids := range fc.calls() {
		for _, id := range ids {
			sent[id]++
		}
	}
	for _, r := range results {
		if r.Err() != nil || sent[r.ID()] != 1 {
			t.Fatalf("%s: err %v, sent %d times", r.ID(), r.Err(), sent[r.ID()])
		}
	}
	if len(results) != 4000 {
		t.Fatalf("%d results", len(results))
	}
}

// discardConn is a membus connection whose publishes store nothing: what
// a test publishes is reachable from nowhere but omnibus.
type discardConn struct{ driver.Conn }

func (discardConn) Publish(context.Context, string, []*driver.Message, driver.PublishOptions) error {
	return nil
}

// TestPublishReleasesMessages: once a message's outcome is known, omnibus
// holds nothing of it, its body above all, while the Client and the
// Publisher stay open: a message at a time (which leaves a Publisher's
// queue a part-filled array), in batches, and through Client.Publish
// from many goroutines (calls that wait and are sent together).
func TestPublishReleasesMessages(t *testing.T) {
	c, err := omnibus.New(discardConn{membus.New(membus.Config{Partitions: 4}).Conn()},
		omnibus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	p := newPublisher(t, c, omnibus.Linger(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var released atomic.Int64
	// message returns a message whose body counts in released once
	// nothing holds it.
	message := func(i int) *omnibus.Message {
		body := make([]byte, 1<<10)
		runtime.AddCleanup(&body[0], func(*atomic.Int64) { released.Add(1) }, &released)
		return &omnibus.Message{Key: strconv.Itoa(i % 3), Body: body}
	}
	// expect collects garbage until want bodies are released.
	expect := func(step string, want int64) {
		t.Helper()
		for range 50 {
			runtime.GC()
			if released.Load() == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: %d of %d message bodies released after their outcome", step, released.Load(), want)
	}

	for i := range 10 { // a trickle: each flushed alone
		r, err := p.Publish(ctx, "t", message(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
		expect(fmt.Sprintf("Publisher, message %d alone", i), int64(i+1))
	}
	for i := range 1000 {
		if _, err := p.Publish(ctx, "t", message(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	expect("Publisher, 1000 in batches", 1010)

	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 20 {
				if err := c.Publish(ctx, "t", message(g*20+i), message(g*20+i+1)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	expect("Client.Publish from 32 goroutines", 1010+32*20*2)
}

// publishEnd is a PublishHook whose end calls fn, on whatever goroutine
// settles the publish.
type publishEnd struct{ fn func() }

func (h publishEnd) OnPublish(ctx context.Context, _ string, _ []*omnibus.Message) (context.Context, func(error)) {
	return ctx, func(error) { h.fn() }
}

// TestPublisherReentered: a PublishHook's end runs on the Publisher's
// sender, before the messages it ends free their room. Called from
// there, Flush and Close would wait for that sender, and a Publish into
// a full buffer for room only it frees: each fails at once with a clear
// error instead, and the Publisher goes on. Nothing waits on a context
// that would end it.
func TestPublisherReentered(t *testing.T) {
	var p *omnibus.Publisher
	var mu sync.Mutex
	var errs []error
	var first atomic.Bool // the ends of the calls below run too
	inEnd := make(chan struct{})
	hook := publishEnd{fn: func() {
		if !first.CompareAndSwap(false, true) {
			return
		}
		func() {
			defer close(inEnd)
			ctx := context.Background() // a hook that waits forever if let
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, p.Flush(ctx))
			_, err := p.Publish(ctx, "t", &omnibus.Message{Body: []byte("again")})
			errs = append(errs, err)
			errs = append(errs, p.Close(ctx))
		}()
	}}
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 1}).Conn(), quiet(), omnibus.WithHooks(hook))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	p = newPublisher(t, c, omnibus.MaxBuffered(1, 1<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := p.Publish(ctx, "t", &omnibus.Message{Body: []byte("first")})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-inEnd:
	case <-time.After(5 * time.Second):
		t.Fatal("the hook's calls into its Publisher still wait after 5 s")
	}
	if err := r.Get(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, op := range []string{"Flush", "Publish into a full buffer", "Close"} {
		if !errors.Is(errs[i], omnibus.ErrInvalid) {
			t.Errorf("%s from a PublishHook's end: %v, want an error wrapping ErrInvalid", op, errs[i])
		}
	}
	t.Logf("Flush from the end: %v", errs[0])
	// The Publisher is not closed and still takes messages.
	r, err = p.Publish(ctx, "t", &omnibus.Message{Body: []byte("later")})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Get(ctx); err != nil {
		t.Fatal(err)
	}
}

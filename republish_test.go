package omnibus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/membus"
)

// flakyConn is a membus connection whose publishes fail as a transport's
// do during a broker restart: fail(try, i) says how the message with body
// i (batch numbers them) fails in the try-th Publish call (nil: it lands). A message failing with
// ErrOutcomeUnknown is stored all the same (the confirm was lost); one
// failing with ErrRetryable or anything else is not.
type flakyConn struct {
	driver.Conn
	fail func(try, i int) error

	mu    sync.Mutex
	tries int
	sent  [][]string // IDs per call
}

func (f *flakyConn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	f.mu.Lock()
	f.tries++
	try := f.tries
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	f.sent = append(f.sent, ids)
	f.mu.Unlock()
	errs := make([]error, len(msgs))
	var land []*driver.Message
	failed := false
	for i, m := range msgs {
		n, _ := strconv.Atoi(string(m.Body))
		errs[i] = f.fail(try, n)
		if errs[i] == nil || errors.Is(errs[i], driver.ErrOutcomeUnknown) {
			land = append(land, m)
		}
		failed = failed || errs[i] != nil
	}
	if len(land) > 0 {
		if err := f.Conn.Publish(ctx, topic, land, opts); err != nil {
			return err
		}
	}
	if !failed {
		return nil
	}
	return &driver.MessageErrors{Errs: errs}
}

func (f *flakyConn) calls() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sent)
}

// retryCounter is a PublishRetryHook.
type retryCounter struct {
	mu      sync.Mutex
	retries []omnibus.PublishRetry
}

func (r *retryCounter) OnPublishRetry(p omnibus.PublishRetry) {
	r.mu.Lock()
	r.retries = append(r.retries, p)
	r.mu.Unlock()
}

func flakyClient(t *testing.T, fail func(try, i int) error) (*omnibus.Client, *flakyConn, *retryCounter, *membus.Bus) {
	t.Helper()
	bus := membus.New(membus.Config{Partitions: 1})
	fc := &flakyConn{Conn: bus.Conn(), fail: fail}
	rc := &retryCounter{}
	c, err := omnibus.New(fc, omnibus.WithHooks(rc), omnibus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, fc, rc, bus
}

func batch(n int) []*omnibus.Message {
	ms := make([]*omnibus.Message, n)
	for i := range ms {
		ms[i] = &omnibus.Message{Body: []byte(fmt.Sprint(i))}
	}
	return ms
}

// TestPublishRidesThrough: messages failing with a mark are published
// again with the same IDs, only they, until they land; the others are
// not sent twice, and what failed otherwise is reported at its place.
func TestPublishRidesThrough(t *testing.T) {
	unknown := fmt.Errorf("connection reset before the confirm: %w", driver.ErrOutcomeUnknown)
	retryable := fmt.Errorf("no connection: %w", driver.ErrRetryable)
	refused := fmt.Errorf("refused: %w", driver.ErrInvalid)
	c, fc, rc, _ := flakyClient(t, func(try, i int) error {
		switch {
		case i == 3:
			return refused // every time: not tried again
		case try == 1 && i%2 == 0:
			return unknown
		case try <= 3 && i == 1:
			return retryable
		}
		return nil
	})
	ms := batch(6)
	err := c.Publish(context.Background(), "t", ms...)
	var pe *omnibus.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[0].Index != 3 || !errors.Is(err, omnibus.ErrInvalid) {
		t.Fatalf("Publish: got %v, want a *PublishError naming message 3 alone", err)
	}
	id := func(is ...int) []string {
		var ids []string
		for _, i := range is {
			ids = append(ids, ms[i].ID)
		}
		return ids
	}
	want := [][]string{id(0, 1, 2, 3, 4, 5), id(0, 1, 2, 4), id(1), id(1)}
	if got := fc.calls(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("calls to the transport:\n got %v\nwant %v", got, want)
	}
	if len(rc.retries) != 3 || rc.retries[0].Attempt != 1 || !errors.Is(rc.retries[0].Err, omnibus.ErrOutcomeUnknown) ||
		!slices.Equal(rc.retries[0].IDs, id(0, 1, 2, 4)) || rc.retries[2].Attempt != 3 {
		t.Errorf("PublishRetryHook saw %+v", rc.retries)
	}
}

// TestPublishRetriesUntilContextEnds: a transport that keeps failing with
// a mark is tried until the context's deadline, and Publish then says both
// why the messages failed and that the context ended.
func TestPublishRetriesUntilContextEnds(t *testing.T) {
	c, fc, _, _ := flakyClient(t, func(int, int) error {
		return fmt.Errorf("broker restarting: %w", driver.ErrRetryable)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Publish(ctx, "t", batch(2)...)
	took := time.Since(start)
	if !errors.Is(err, omnibus.ErrRetryable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish: got %v, want ErrRetryable and DeadlineExceeded", err)
	}
	if took > time.Second {
		t.Errorf("Publish returned %v after its 500ms deadline", took)
	}
	if n := len(fc.calls()); n < 3 {
		t.Errorf("the transport was tried %d times in 500ms, want several", n)
	}
	t.Logf("%d tries in %v: %v", len(fc.calls()), took.Round(time.Millisecond), err)
}

// TestPublishDoesNotRetryOtherErrors: an error without a mark, and a
// closed client, end Publish at once.
func TestPublishDoesNotRetryOtherErrors(t *testing.T) {
	c, fc, _, _ := flakyClient(t, func(int, int) error { return errors.New("no permission") })
	if err := c.Publish(context.Background(), "t", batch(2)...); err == nil {
		t.Fatal("Publish succeeded")
	}
	if n := len(fc.calls()); n != 1 {
		t.Errorf("the transport was tried %d times, want once", n)
	}
	c2, fc2, _, _ := flakyClient(t, func(int, int) error { return fmt.Errorf("down: %w", driver.ErrRetryable) })
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = c2.Close()
	}()
	err := c2.Publish(context.Background(), "t", batch(1)...)
	if !errors.Is(err, omnibus.ErrClosed) {
		t.Errorf("Publish on a client closed while retrying: got %v, want ErrClosed", err)
	}
	t.Logf("closed after %d tries: %v", len(fc2.calls()), err)
}

// TestPublishDuplicatesAfterUnknownOutcome: a message whose outcome was
// unknown but which landed is stored again on a transport without
// duplicate detection (membus), under the same ID: a consumer sees the ID
// twice, never a message lost.
func TestPublishDuplicatesAfterUnknownOutcome(t *testing.T) {
	c, _, _, bus := flakyClient(t, func(try, i int) error {
		if try == 1 {
			return fmt.Errorf("confirm lost: %w", driver.ErrOutcomeUnknown)
		}
		return nil
	})
	ms := batch(3)
	if err := c.Publish(context.Background(), "t", ms...); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	var mu sync.Mutex
	sub, err := omnibus.New(bus.Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	k, err := sub.Subscribe(context.Background(), "t", func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		seen[m.ID]++
		mu.Unlock()
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := 0
		for _, m := range ms {
			n += seen[m.ID]
		}
		mu.Unlock()
		if n == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("seen %v, want each of the 3 IDs twice", seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

// TestDeadLetterRetrySeen: a dead letter whose publish failed with an
// unknown outcome (stored all the same) is published again by the
// engine, and PublishRetryHook sees that try, as it sees
// Client.Publish's: a transport that keeps no IDs stores it twice, and
// only the hook can tell a user (or the conformance suite) why.
func TestDeadLetterRetrySeen(t *testing.T) {
	// Try 1 publishes the message; try 2, its dead letter, loses its
	// confirm; try 3, the dead letter again, lands.
	c, fc, rc, _ := flakyClient(t, func(try, i int) error {
		if try == 2 {
			return fmt.Errorf("confirm lost: %w", driver.ErrOutcomeUnknown)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := &omnibus.Message{Body: []byte("0")}
	if err := c.Publish(ctx, "t", m); err != nil {
		t.Fatal(err)
	}
	dead := make(chan omnibus.Event, 4)
	k, err := c.Subscribe(ctx, "t", func(context.Context, *omnibus.Message) error { return errors.New("no") },
		omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxAttempts(1), omnibus.DeadLetterTopic("t-dlq"),
		omnibus.Backoff(time.Millisecond, 5*time.Millisecond), omnibus.Observe(func(e omnibus.Event) {
			if e.Kind == omnibus.EventDeadLettered {
				dead <- e
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = k.Run(ctx) }()
	select {
	case <-dead:
	case <-time.After(10 * time.Second):
		t.Fatalf("not dead-lettered; publishes %v", fc.calls())
	}
	if calls := fc.calls(); len(calls) != 3 {
		t.Fatalf("publishes %v, want the message and its dead letter twice", calls)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.retries) != 1 {
		t.Fatalf("hook saw %d retries, want 1: %+v", len(rc.retries), rc.retries)
	}
	r := rc.retries[0]
	if r.Topic != "t-dlq" || !slices.Equal(r.IDs, []string{m.ID}) || r.Attempt != 1 || !errors.Is(r.Err, omnibus.ErrOutcomeUnknown) {
		t.Fatalf("hook saw %+v, want the dead letter %q to t-dlq after try 1, outcome unknown", r, m.ID)
	}
}

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

// slowConn is a membus connection whose publishes take delay and record
// the IDs of each call; a message whose body is "bad" fails alone.
type slowConn struct {
	driver.Conn
	delay time.Duration

	mu    sync.Mutex
	calls [][]string
}

// started returns the driver calls started so far, each as its IDs.
func (s *slowConn) started() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func (s *slowConn) Publish(ctx context.Context, topic string, msgs []*driver.Message, opts driver.PublishOptions) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	s.mu.Lock()
	s.calls = append(s.calls, ids)
	s.mu.Unlock()
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return fmt.Errorf("slow: %w: %w", driver.ErrOutcomeUnknown, ctx.Err())
	}
	var errs []error
	var good []*driver.Message
	for i, m := range msgs {
		if string(m.Body) == "bad" {
			if errs == nil {
				errs = make([]error, len(msgs))
			}
			errs[i] = fmt.Errorf("slow: %w", driver.ErrInvalid)
			continue
		}
		good = append(good, m)
	}
	if err := s.Conn.Publish(ctx, topic, good, opts); err != nil {
		return err
	}
	if errs != nil {
		return &driver.MessageErrors{Errs: errs}
	}
	return nil
}

func slowClient(t *testing.T, delay time.Duration) (*omnibus.Client, *slowConn) {
	t.Helper()
	sc := &slowConn{Conn: membus.New(membus.Config{Partitions: 1}).Conn(), delay: delay}
	c, err := omnibus.New(sc, omnibus.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, sc
}

// TestPublishCoalesces: 16 goroutines publishing one message at a time
// while the transport takes 5ms a call share driver calls; each message
// is sent once, and a message that fails fails its own Publish only.
func TestPublishCoalesces(t *testing.T) {
	c, sc := slowClient(t, 5*time.Millisecond)
	const goroutines, each = 16, 20
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				body := strconv.Itoa(g*each + i)
				if g == 3 && i == 7 {
					body = "bad"
				}
				err := c.Publish(context.Background(), "t", &omnibus.Message{ID: "m" + strconv.Itoa(g*each+i), Body: []byte(body)})
				if (body == "bad") != (err != nil) {
					errs <- fmt.Errorf("message %d (%s): %v", g*each+i, body, err)
				}
				if body == "bad" {
					var pe *omnibus.PublishError
					if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[0].Index != 0 || !errors.Is(err, omnibus.ErrInvalid) {
						errs <- fmt.Errorf("the bad message's error: %v", err)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sent := map[string]int{}
	for _, ids := range sc.calls {
		for _, id := range ids {
			sent[id]++
		}
	}
	for i := range goroutines * each {
		if n := sent["m"+strconv.Itoa(i)]; n != 1 {
			t.Errorf("message %d sent %d times", i, n)
		}
	}
	if len(sc.calls) > goroutines*each/2 {
		t.Errorf("%d driver calls for %d messages: not coalesced", len(sc.calls), goroutines*each)
	}
	t.Logf("%d messages in %d driver calls", goroutines*each, len(sc.calls))
}

// leads puts n publishes in flight and returns their outcomes.
func leads(c *omnibus.Client, n int) chan error {
	out := make(chan error, n)
	for i := range n {
		go func() { out <- c.Publish(context.Background(), "t", &omnibus.Message{ID: "lead" + strconv.Itoa(i)}) }()
	}
	return out
}

// TestPublishCoalescedContext: with four publishes in flight (as many as
// go before calls wait), a Publish whose ctx ends while it waits is not
// sent and says so; one whose ctx ends while its
// call is in flight reports an unknown outcome; the others are not
// cancelled by it.
func TestPublishCoalescedContext(t *testing.T) {
	c, sc := slowClient(t, 300*time.Millisecond)
	first := leads(c, 4)
	waitFor(t, func() bool { return len(sc.started()) == 4 }, "the leads in flight")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := c.Publish(ctx, "t", &omnibus.Message{ID: "queued"})
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, omnibus.ErrOutcomeUnknown) {
		t.Fatalf("queued publish: %v, want not sent (DeadlineExceeded, no ErrOutcomeUnknown)", err)
	}
	for range 4 {
		if err := <-first; err != nil {
			t.Fatalf("lead: %v", err)
		}
	}
	// Two calls in one driver publish: one caller gives up, the other's
	// message still lands.
	first = leads(c, 4)
	waitFor(t, func() bool { return len(sc.started()) == 8 }, "the second leads in flight")
	keep := make(chan error, 1)
	go func() { keep <- c.Publish(context.Background(), "t", &omnibus.Message{ID: "keep"}) }()
	ctx2, cancel2 := context.WithCancel(context.Background())
	quit := make(chan error, 1)
	go func() { quit <- c.Publish(ctx2, "t", &omnibus.Message{ID: "quit"}) }()
	waitFor(t, func() bool { return len(sc.started()) == 9 }, "keep and quit in flight, once the leads returned")
	cancel2()
	if err := <-quit; !errors.Is(err, omnibus.ErrOutcomeUnknown) {
		t.Errorf("quit: %v, want ErrOutcomeUnknown", err)
	}
	if err := <-keep; err != nil {
		t.Errorf("keep: %v", err)
	}
	for range 4 {
		if err := <-first; err != nil {
			t.Errorf("lead: %v", err)
		}
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	together := false
	for _, ids := range sc.calls {
		if slices.Contains(ids, "queued") {
			t.Errorf("the queued message whose ctx ended was sent")
		}
		together = together || slices.Contains(ids, "keep") && slices.Contains(ids, "quit")
	}
	if !together {
		t.Errorf("keep and quit were not sent in one driver publish: %v", sc.calls)
	}
}

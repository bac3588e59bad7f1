// Package dlqtest gives the tests of the dead-letter tools a service that
// makes dead letters and counts their replays. Only tests import it.
package dlqtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/dlq"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
)

// Service is a consumer group that fails every message for good (so the
// engine dead-letters it at once) until it comes back replayed: a
// message carrying dlq.HeaderReplays is handled, and counted by the ID
// it was dead-lettered with (dlq.HeaderReplayedID).
type Service struct {
	Consumer *omnibus.Consumer
	// Republished, when set, is the replaying client's record of the
	// messages it published again: WaitHandled lets those arrive twice.
	Republished *Republished

	mu      sync.Mutex
	twice   int64 // replayed messages that may be handled twice: AllowTwice
	dead    int
	handled map[string]int
	last    map[string]*omnibus.Message
	expect  map[string]bool
}

// Republished is a publish-retry hook (pass it to omnibus.WithHooks) that
// records the IDs of the messages a client published again after an
// error. Where that error left the outcome unknown and the first try had
// landed, a transport that keeps no message IDs (Kinesis, say) stores
// the message twice: at least once, the one duplicate the guarantee
// allows.
type Republished struct {
	mu  sync.Mutex
	ids map[string]bool
}

// OnPublishRetry implements omnibus.PublishRetryHook.
func (r *Republished) OnPublishRetry(p omnibus.PublishRetry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = map[string]bool{}
	}
	for _, id := range p.IDs {
		r.ids[id] = true
	}
}

// has reports whether the message with id was published again.
func (r *Republished) has(id string) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[id]
}

// Start subscribes group to topic on c and runs it until the test ends.
// It returns once the group exists, so what is published next reaches it.
func Start(t testing.TB, ctx context.Context, c *omnibus.Client, topic, group string) *Service {
	t.Helper()
	s := &Service{handled: map[string]int{}, last: map[string]*omnibus.Message{}, expect: map[string]bool{}}
	start := omnibus.StartLatest
	if c.Capabilities().Replay {
		start = omnibus.StartEarliest
	}
	k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		if m.Headers[dlq.HeaderReplays] == "" {
			return omnibus.Permanent(errors.New("poison: " + m.Key))
		}
		id := m.Headers[dlq.HeaderReplayedID]
		s.mu.Lock()
		s.handled[id]++
		c := *m // the engine reuses m once the handler returned
		c.Headers, c.Body = maps.Clone(m.Headers), slices.Clone(m.Body)
		s.last[id] = &c
		s.mu.Unlock()
		return nil
	}, omnibus.Group(group), omnibus.StartFrom(start), omnibus.Order(omnibus.OrderNone), omnibus.MaxInFlight(256),
		omnibus.Observe(func(e omnibus.Event) {
			if e.Kind == omnibus.EventDeadLettered {
				s.mu.Lock()
				s.dead++
				s.mu.Unlock()
			}
		}))
	if err != nil {
		t.Fatalf("subscribe %s: %v", topic, err)
	}
	s.Consumer = k
	done := make(chan struct{})
	go func() { defer close(done); _ = k.Run(context.WithoutCancel(ctx)) }()
	t.Cleanup(func() { _ = k.Close(); <-done })
	return s
}

// Dead reports how many messages the service dead-lettered.
func (s *Service) Dead() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

// Handled returns how many times each replayed message was handled, by
// its original ID.
func (s *Service) Handled() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.handled)
}

// Message returns the last replayed message handled whose original ID
// is id.
func (s *Service) Message(id string) *omnibus.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[id]
}

// Publish publishes n messages (keys k0.., bodies from body, which may be
// nil for "message <i>") to topic in batches and waits until the
// service dead-lettered them all. It returns their IDs in order.
func (s *Service) Publish(t testing.TB, ctx context.Context, c *omnibus.Client, topic string, n int, body func(i int) []byte) []string {
	t.Helper()
	before := s.Dead()
	ids := make([]string, 0, n)
	for from := 0; from < n; from += 200 {
		var batch []*omnibus.Message
		for i := from; i < min(n, from+200); i++ {
			b := []byte(fmt.Sprint("message ", i))
			if body != nil {
				b = body(i)
			}
			m := &omnibus.Message{ID: omnibus.NewID(), Key: fmt.Sprint("k", i%37), Type: "test.order", Body: b,
				Headers: map[string]string{"tenant": "acme"}}
			ids = append(ids, m.ID)
			batch = append(batch, m)
		}
		if err := c.Publish(ctx, topic, batch...); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	Eventually(t, 60*time.Second, func() error {
		if d := s.Dead() - before; d < n {
			return fmt.Errorf("%d of %d dead-lettered", d, n)
		}
		return nil
	})
	return ids
}

// AllowTwice lets n more replayed messages, whichever they are, be
// handled twice: a replaying client that reports how many messages it
// published again (the CLI's replay) but not which.
func (s *Service) AllowTwice(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.twice += n
}

// WaitHandled waits until every id was handled, and fails the test when
// an ID was handled twice, or one not given to WaitHandled (in this call
// or an earlier one) was handled at all.
func (s *Service) WaitHandled(t testing.TB, ids []string) {
	t.Helper()
	want := map[string]bool{}
	s.mu.Lock()
	for _, id := range ids {
		want[id] = true
		s.expect[id] = true
	}
	s.mu.Unlock()
	Eventually(t, 60*time.Second, func() error {
		h := s.Handled()
		missing := 0
		for id := range want {
			if h[id] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d replayed messages not handled yet", missing, len(want))
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond) // a copy would come at once
	s.mu.Lock()
	expect, twice := maps.Clone(s.expect), s.twice
	s.mu.Unlock()
	for id, n := range s.Handled() {
		switch {
		case !expect[id]:
			t.Errorf("handled %s, which was not replayed (%d times)", id, n)
		case n != 1 && s.Republished.has(s.Message(id).ID):
			t.Logf("handled %s %d times: the replay published it again after an error", id, n)
		case n == 2 && twice > 0:
			twice--
			t.Logf("handled %s twice: the replay said it published messages again after an error", id)
		case n != 1:
			t.Errorf("handled %s %d times, want once", id, n)
		}
	}
}

// Eventually is observetest.Eventually.
var Eventually = observetest.Eventually

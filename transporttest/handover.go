package transporttest

// Handovers on an idle topic (hostile): a member whose fetch loop waits
// in Receive for messages that do not come gives lanes up to a member
// that joins, and takes them back when it leaves, again and again. A
// revocation waits for the Receive in progress to return; the driver must
// make it return at once, and so must a Receive the fetch loop starts
// before the engine begins to wait, or the handover takes DrainTimeout.
// The test runs on the test's goroutine; the handler records into a
// collector.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// handoverBound is how long one handover on an idle topic may take, from
// the change of members until a message published afterwards to every
// lane is handled. It leaves room for a transport's own rebalance (NATS's
// and Redis's partitioned leases, Kafka's group protocol) and is far
// below the DrainTimeout a stalled revocation waits for.
const handoverBound = 10 * time.Second

// handoverDrain is the test consumers' DrainTimeout: what a revocation
// that waits for a Receive nobody wakes takes.
const handoverDrain = 30 * time.Second

// testIdleHandover scales a consumer up and down on an idle topic, then
// has a second consumer join the group and leave, a few rounds each, and
// checks that each change of members returns promptly and that messages
// published afterwards (to every lane) are handled within handoverBound.
func (s *suite) testIdleHandover(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().ExclusiveLanes, "ExclusiveLanes")
	topic := s.topic(t, pub)
	col := newCollector()
	opts := append(earliest(sub), omnibus.Group("idle"), omnibus.DrainTimeout(handoverDrain))
	k := s.subscribe(t, sub, topic, col.handler, opts...)
	run(t, k)
	keys := 8 * s.h.Lanes // enough keys that every lane gets some
	col.await(t, publishN(t, pub, topic, keys, keys, 8))

	// step changes the members (change must return within handoverBound),
	// publishes to every lane after an idle moment and waits for the
	// messages, all within handoverBound, and returns how long it took.
	var worst time.Duration
	var took []string
	step := func(round int, what string, change func()) {
		t.Helper()
		time.Sleep(100 * time.Millisecond) // idle: fetch loops wait in Receive
		began := time.Now()
		done := make(chan struct{})
		go func() { // ends with change, which a stalled revocation holds up to DrainTimeout
			defer close(done)
			change()
		}()
		select {
		case <-done:
		case <-time.After(handoverBound):
			// How long it stalls, for the report: up to DrainTimeout.
			select {
			case <-done:
				t.Fatalf("round %d: %s took %v (DrainTimeout %v), beyond %v", round, what, time.Since(began).Round(time.Millisecond), handoverDrain, handoverBound)
			case <-time.After(handoverDrain):
				t.Fatalf("round %d: %s did not return within %v; goroutines:\n%s", round, what, time.Since(began).Round(time.Millisecond), stacks(t))
			}
		}
		changed := time.Since(began)
		ids := publishN(t, pub, topic, keys, keys, 8)
		left := handoverBound - time.Since(began)
		if !poll(left, func() bool { return len(col.missing(ids)) == 0 }) {
			t.Fatalf("round %d: %s returned after %v, yet %d of %d messages published to every lane afterwards were not handled within %v of it (DrainTimeout %v)",
				round, what, changed.Round(time.Millisecond), len(col.missing(ids)), len(ids), handoverBound, handoverDrain)
		}
		d := time.Since(began)
		worst = max(worst, d)
		took = append(took, fmt.Sprintf("%s %v", what, d.Round(time.Millisecond)))
	}

	const rounds = 8
	for round := range rounds {
		step(round, "Scale(2)", func() {
			if err := k.Scale(ctxT(t), 2); err != nil {
				t.Errorf("Scale(2): %v", err)
			}
		})
		step(round, "Scale(1)", func() {
			if err := k.Scale(ctxT(t), 1); err != nil {
				t.Errorf("Scale(1): %v", err)
			}
		})
	}
	other := s.open(t)
	for round := range rounds {
		ctx, cancel := context.WithCancel(context.Background())
		var k2 *omnibus.Consumer
		var done <-chan error
		step(round, "second consumer joins", func() {
			var err error
			if k2, err = other.Subscribe(ctxT(t), topic, col.handler, opts...); err != nil {
				t.Errorf("Subscribe: %v", err)
				return
			}
			done = start(ctx, k2)
		})
		if k2 == nil {
			cancel()
			t.FailNow()
		}
		step(round, "second consumer leaves", func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run of the second consumer: %v", err)
			}
			_ = k2.Close()
		})
	}
	t.Logf("worst handover %v; %v", worst.Round(time.Millisecond), took)
}

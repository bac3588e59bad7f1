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
	RunConsumer(t, k)
	keys := 8 * s.h.Lanes // enough keys that every lane gets some
	col.await(t, publishN(t, pub, topic, keys, keys, 8))

	// step changes the members (change must return within handoverBound),
	// waits until every lane has one holder and the holders are want in
	// number, publishes to every lane and waits for the messages, all
	// within handoverBound of the change.
	var worst time.Duration
	var took []string
	step := func(round int, what string, want int, change func(), consumers func() []*omnibus.Consumer) {
		t.Helper()
		time.Sleep(100 * time.Millisecond) // idle: fetch loops wait in Receive
		began := time.Now()
		since := func() time.Duration { return time.Since(began).Round(time.Millisecond) }
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
				t.Fatalf("round %d: %s took %v (DrainTimeout %v), beyond %v", round, what, since(), handoverDrain, handoverBound)
			case <-time.After(handoverDrain):
				t.Fatalf("round %d: %s did not return within %v; goroutines:\n%s", round, what, since(), stacks(t))
			}
		}
		changed := since()
		// A transport that rebalances in the background returns from the
		// change at once; a revocation in progress shows as a lane with
		// two holders (the old one's still draining) or a member holding
		// more than its share. A lane may have no holder yet: rabbitbus
		// learns that a member holds a lane from its first delivery, and
		// the messages published next must reach every lane anyway.
		var lanes map[string][]string
		share := (s.h.Lanes + want - 1) / want
		split := func() bool {
			lanes = holders(consumers())
			held := map[string]int{}
			for _, hs := range lanes {
				if len(hs) > 1 {
					return false
				}
				for _, h := range hs {
					held[h]++
				}
			}
			for _, n := range held {
				if n > share {
					return false
				}
			}
			return len(held) <= want
		}
		if !poll(handoverBound-time.Since(began), split) {
			stuck := fmt.Sprint(lanes)
			if poll(handoverDrain, split) {
				t.Fatalf("round %d: %s returned after %v; the lanes were split among %d members (at most one holder each) after %v (DrainTimeout %v), beyond %v; at %v: %s",
					round, what, changed, want, since(), handoverDrain, handoverBound, handoverBound, stuck)
			}
			t.Fatalf("round %d: %s returned after %v; the lanes were not split among %d members (at most one holder each) after %v: %v", round, what, changed, want, since(), lanes)
		}
		ids := publishN(t, pub, topic, keys, keys, 8)
		if !poll(handoverBound-time.Since(began), func() bool { return len(col.missing(ids)) == 0 }) {
			t.Fatalf("round %d: %s returned after %v, yet %d of %d messages published to every lane afterwards were not handled within %v of it",
				round, what, changed, len(col.missing(ids)), len(ids), handoverBound)
		}
		d := time.Since(began)
		worst = max(worst, d)
		took = append(took, fmt.Sprintf("%s %v", what, d.Round(time.Millisecond)))
	}

	const rounds = 4 // the engine tests of the gap (root package) hit it every time; these guard each transport
	one := func() []*omnibus.Consumer { return []*omnibus.Consumer{k} }
	for round := range rounds {
		step(round, "Scale(2)", 2, func() {
			if err := k.Scale(ctxT(t), 2); err != nil {
				t.Errorf("Scale(2): %v", err)
			}
		}, one)
		step(round, "Scale(1)", 1, func() {
			if err := k.Scale(ctxT(t), 1); err != nil {
				t.Errorf("Scale(1): %v", err)
			}
		}, one)
	}
	other := s.open(t)
	for round := range rounds {
		ctx, cancel := context.WithCancel(context.Background())
		var k2 *omnibus.Consumer
		var done <-chan error
		step(round, "second consumer joins", 2, func() {
			var err error
			if k2, err = other.Subscribe(ctxT(t), topic, col.handler, opts...); err != nil {
				t.Errorf("Subscribe: %v", err)
				return
			}
			done = start(ctx, k2)
		}, func() []*omnibus.Consumer { return []*omnibus.Consumer{k, k2} })
		step(round, "second consumer leaves", 1, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run of the second consumer: %v", err)
			}
			_ = k2.Close()
		}, one)
	}
	t.Logf("worst handover %v; %v", worst.Round(time.Millisecond), took)
}

// holders maps each lane the consumers hold to its holders, each named
// by consumer and member ("c0m1"), a lane being drained among them.
func holders(ks []*omnibus.Consumer) map[string][]string {
	lanes := map[string][]string{}
	for i, k := range ks {
		for _, l := range k.Stats().Lanes {
			if l.Member >= 0 {
				lanes[l.Lane] = append(lanes[l.Lane], fmt.Sprintf("c%dm%d", i, l.Member))
			}
		}
	}
	return lanes
}

package natsbus_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// Tests that treat the transport the way a hostile user would: consumers
// deleted behind the group's back, handlers slower than ack_wait, leases
// that run out while another lane drains, members closed at once.

// servers are the servers the hostile tests run against: the embedded one
// (the version natsbus builds with) and the machine's (which may be
// older).
func servers(t *testing.T) map[string]string {
	return map[string]string{
		"Embedded": natsbus.EmbeddedURL(t.TempDir()),
		"External": externalURL(t),
	}
}

// onServers runs test on each of the servers, with a context that ends
// after timeout.
func onServers(t *testing.T, timeout time.Duration, test func(t *testing.T, ctx context.Context, base string)) {
	for name, base := range servers(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			test(t, ctx, base)
		})
	}
}

// newTopic creates a topic of parts lanes for the test.
func newTopic(ctx context.Context, t testing.TB, c *omnibus.Client, base string, parts int) string {
	t.Helper()
	topic := topicName(t, base)
	if err := c.CreateTopic(ctx, topic, parts); err != nil {
		t.Fatal(err)
	}
	return topic
}

// rawJetStream opens rawURL with natsbus and returns a jetstream handle on
// the same server, for what a test does behind the group's back.
func rawJetStream(t testing.TB, rawURL string) jetstream.JetStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	dc, nc, err := natsbus.OpenConn(ctx, rawURL)
	if err != nil {
		t.Fatalf("open %s: %v", rawURL, err)
	}
	t.Cleanup(func() { _ = dc.Close() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// holdsLanes waits up to 15 seconds for k to hold n lanes.
func holdsLanes(t testing.TB, k *omnibus.Consumer, n int) {
	t.Helper()
	eventually(t, 15*time.Second, func() error {
		if got := len(k.Stats().Lanes); got != n {
			return fmt.Errorf("the member holds %d lanes, want %d", got, n)
		}
		return nil
	})
}

// keysOn returns n distinct keys that land on partition p of parts.
func keysOn(p, parts, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		if k := "k" + strconv.Itoa(i); natsbus.Partition(k, parts) == p {
			keys = append(keys, k)
		}
	}
	return keys
}

// publishTo publishes one message per key and returns their IDs.
func publishTo(t testing.TB, c *omnibus.Client, topic string, keys []string) []string {
	t.Helper()
	ms := make([]*omnibus.Message, len(keys))
	for i, k := range keys {
		ms[i] = &omnibus.Message{Key: k, Body: []byte("x")}
	}
	return publishMsgs(t, c, topic, ms)
}

// publishMsgs publishes ms and returns their IDs.
func publishMsgs(t testing.TB, c *omnibus.Client, topic string, ms []*omnibus.Message) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Publish(ctx, topic, ms...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

// missing returns the IDs col has not seen.
func (c *collector) missing(ids []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, id := range ids {
		if c.seen[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// waitAll waits up to timeout for every id and reports how many arrived.
func (c *collector) waitAll(t testing.TB, ids []string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(c.missing(ids)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if m := c.missing(ids); len(m) > 0 {
		t.Fatalf("%d of %d delivered within %v", len(ids)-len(m), len(ids), timeout)
	}
}

// TestMissingConsumer deletes a group's consumer (a partition's, or the
// unpartitioned group's) behind its back, while the group is stopped and
// while it runs: what was published meanwhile must still be delivered. A
// group that exists never starts again at the end of the stream.
func TestMissingConsumer(t *testing.T) {
	for name, base := range servers(t) {
		for _, tt := range []struct {
			name     string
			params   string
			parts    int
			consumer string
		}{
			{"Partitioned", testParams, 4, "g_p0"},
			{"Unpartitioned", "ack_wait=5s", 1, "g"},
		} {
			for _, running := range []bool{false, true} {
				state := "Stopped"
				if running {
					state = "Running"
				}
				t.Run(name+"/"+tt.name+"/"+state, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					u := withParams(base, tt.params)
					c := transporttest.Open(t, u)
					js := rawJetStream(t, u)
					topic := newTopic(ctx, t, c, base, tt.parts)
					col := newCollector()
					k, err := c.Subscribe(ctx, topic, col.handle, omnibus.Group("g"))
					if err != nil {
						t.Fatal(err)
					}
					ids := publishTo(t, c, topic, keysOn(0, tt.parts, 5))
					if running {
						transporttest.RunConsumer(t, k)
						col.waitAll(t, ids, 30*time.Second)
					} else if err := k.Close(); err != nil {
						t.Fatal(err)
					}
					// The server may fail a delete racing its own writes of
					// the consumer's state: try again.
					eventually(t, 10*time.Second, func() error { return js.DeleteConsumer(ctx, topic, tt.consumer) })
					ids = publishTo(t, c, topic, keysOn(0, tt.parts, 10))
					if !running {
						k, err = c.Subscribe(ctx, topic, col.handle, omnibus.Group("g"))
						if err != nil {
							t.Fatal(err)
						}
						transporttest.RunConsumer(t, k)
					}
					col.waitAll(t, ids, 30*time.Second)
				})
			}
		}
	}
}

// strictOrder checks key order the strict way: no older message of a key
// is handled after a newer one was settled, redeliveries included.
type strictOrder struct {
	mu         sync.Mutex
	settled    map[string]int // highest sequence settled, per key
	ids        map[string]int
	deliveries int
	backs      int
	first      string
}

func newStrictOrder() *strictOrder {
	return &strictOrder{settled: map[string]int{}, ids: map[string]int{}}
}

// begin records a delivery of m before its handler works on it.
func (o *strictOrder) begin(m *omnibus.Message) (int, error) {
	seq, err := strconv.Atoi(m.Headers["seq"])
	if err != nil {
		return 0, omnibus.Permanent(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deliveries++
	o.ids[m.ID]++
	if last := o.settled[m.Key]; seq < last {
		o.backs++
		if o.first == "" {
			o.first = fmt.Sprintf("key %s: sequence %d handled after %d was settled (attempt %d)", m.Key, seq, last, m.Attempt)
		}
	}
	return seq, nil
}

// done records that m's handler succeeded.
func (o *strictOrder) done(m *omnibus.Message, seq int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if seq > o.settled[m.Key] {
		o.settled[m.Key] = seq
	}
}

func (o *strictOrder) unique() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ids)
}

// TestSlowHandlerKeepsKeyOrder runs a handler slower than ack_wait allows
// for everything the transport prefetches: 120 messages of one key,
// ack_wait 1s, MaxInFlight 2, 40 ms per message (about 5 s in all). Every
// message is handled once, in order: what the pull holds gets in-progress
// signals, and a copy the server redelivers anyway is dropped.
func TestSlowHandlerKeepsKeyOrder(t *testing.T) {
	onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
		const n = 120
		u := withParams(base, "partitions=4&ack_wait=1s&lease_ttl=2s&rebalance_interval=100ms")
		c := transporttest.Open(t, u)
		topic := newTopic(ctx, t, c, base, 4)
		var ms []*omnibus.Message
		for i := 1; i <= n; i++ {
			ms = append(ms, &omnibus.Message{Key: "k", Headers: map[string]string{"seq": strconv.Itoa(i)}, Body: []byte("x")})
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatal(err)
		}
		o := newStrictOrder()
		k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
			seq, err := o.begin(m)
			if err != nil {
				return err
			}
			time.Sleep(40 * time.Millisecond)
			o.done(m, seq)
			return nil
		}, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(2), omnibus.Order(omnibus.OrderKey))
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, k)
		eventually(t, time.Minute, func() error {
			if got := o.unique(); got < n {
				return fmt.Errorf("handled %d of %d", got, n)
			}
			return nil
		})
		// A redelivery comes ack_wait after its delivery: watch for
		// one that long after the last message.
		time.Sleep(1500 * time.Millisecond)
		o.mu.Lock()
		defer o.mu.Unlock()
		t.Logf("%d deliveries of %d messages, %d went back to an older message", o.deliveries, n, o.backs)
		if o.backs > 0 {
			t.Errorf("%d deliveries went back to an older message, first: %s", o.backs, o.first)
		}
	})
}

// TestLostNotBehindDrain holds a member in a lane's drain (a handler that
// does not return, a long DrainTimeout) while it loses the lease of
// another lane: the engine hears of that loss at once, not after the
// drain.
func TestLostNotBehindDrain(t *testing.T) {
	onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
		u := withParams(base, testParams)
		c := transporttest.Open(t, u)
		js := rawJetStream(t, u)
		topic := newTopic(ctx, t, c, base, 4)
		// The first member's handler blocks on every message until the
		// test ends, so whichever lane it gives up drains for as long
		// as DrainTimeout allows.
		release := make(chan struct{})
		var mu sync.Mutex
		events := map[omnibus.EventKind][]string{}
		var lostAt time.Time
		observe := omnibus.Observe(func(e omnibus.Event) {
			switch e.Kind {
			case omnibus.EventClaimed, omnibus.EventRevoked, omnibus.EventLost:
				mu.Lock()
				events[e.Kind] = append(events[e.Kind], e.Lanes...)
				if e.Kind == omnibus.EventLost && lostAt.IsZero() {
					lostAt = time.Now()
				}
				mu.Unlock()
			}
		})
		a, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}, omnibus.Group("g"), omnibus.DrainTimeout(time.Minute), observe)
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, a)
		t.Cleanup(func() { close(release) }) // before a's drain: cleanups run last first
		holdsLanes(t, a, 4)
		// A message on every lane: whichever the member gives up has
		// one in flight.
		var keys []string
		for p := range 4 {
			keys = append(keys, keysOn(p, 4, 1)...)
		}
		publishTo(t, c, topic, keys)
		// A second member makes the first give lanes up, one at a
		// time: the first release drains until the test ends.
		b, err := transporttest.Open(t, u).Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil },
			omnibus.Group("g"))
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, b)
		time.Sleep(time.Second) // the rebalance starts and the first drain blocks
		mu.Lock()
		revoked := len(events[omnibus.EventRevoked])
		mu.Unlock()
		if revoked != 0 {
			t.Fatalf("a lane was revoked (%d) although its handler never returns", revoked)
		}
		// Take a lease of the first member away behind its back: the
		// bucket forgets it, and the second member may claim it.
		kv, err := js.KeyValue(ctx, natsbus.LeaseBucket(topic, "g"))
		if err != nil {
			t.Fatal(err)
		}
		var victim string
		for p := range 4 {
			key := "p." + strconv.Itoa(p)
			if e, err := kv.Get(ctx, key); err == nil && len(e.Value()) > 0 {
				if err := kv.Purge(ctx, key); err != nil {
					t.Fatal(err)
				}
				victim = strconv.Itoa(p)
				break
			}
		}
		if victim == "" {
			t.Fatal("no lease found")
		}
		taken := time.Now()
		deadline := taken.Add(10 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			at := lostAt
			mu.Unlock()
			if !at.IsZero() {
				t.Logf("lane %s lost %v after its lease was taken", victim, at.Sub(taken).Round(time.Millisecond))
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the engine did not hear of the lost lease of lane %s within 10s (events %v)", victim, events)
	})
}

// TestCloseLeavesNoLease closes members right after Subscribe, while they
// may be claiming partitions: none of their leases may outlive Close.
func TestCloseLeavesNoLease(t *testing.T) {
	onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
		const tries = 20
		// The default lease_ttl, so that a lease left behind is still
		// there when the test looks.
		u := withParams(base, "partitions=4&rebalance_interval=10ms")
		c := transporttest.Open(t, u)
		js := rawJetStream(t, u)
		topic := newTopic(ctx, t, c, base, 4)
		leaked := 0
		for i := range tries {
			group := "g" + strconv.Itoa(i)
			k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group(group))
			if err != nil {
				t.Fatal(err)
			}
			// The member's balancer claims partitions from here on.
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			if err := k.Close(); err != nil {
				t.Fatal(err)
			}
			kv, err := js.KeyValue(ctx, natsbus.LeaseBucket(topic, group))
			if err != nil {
				t.Fatal(err)
			}
			keys, err := kv.ListKeysFiltered(ctx, "p.>")
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for key := range keys.Keys() {
				left = append(left, key)
			}
			if len(left) > 0 {
				leaked++
				t.Logf("try %d: leases %v left after Close", i, left)
			}
		}
		if leaked > 0 {
			t.Fatalf("%d of %d closed members left leases behind", leaked, tries)
		}
	})
}

// TestShutdownHandsBack has two members of an unpartitioned group share a
// backlog; one shuts down gracefully midway. What it had received and not
// handled goes back at once, so the other member gets everything well
// before ack_wait (30s) could bring it back.
func TestShutdownHandsBack(t *testing.T) {
	onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
		const n = 3000
		c := transporttest.Open(t, base)
		topic := newTopic(ctx, t, c, base, 1)
		col := newCollector()
		slow := func(ctx context.Context, m *omnibus.Message) error {
			time.Sleep(time.Millisecond)
			return col.handle(ctx, m)
		}
		var ks []*omnibus.Consumer
		for range 2 {
			k, err := transporttest.Open(t, base).Subscribe(ctx, topic, slow, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest),
				omnibus.Order(omnibus.OrderNone), omnibus.MaxInFlight(64))
			if err != nil {
				t.Fatal(err)
			}
			ks = append(ks, k)
		}
		ids := publishN(t, c, topic, n, 16)
		start := time.Now()
		transporttest.RunConsumer(t, ks[1])
		kctx, kcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- ks[0].Run(kctx) }()
		defer kcancel()
		eventually(t, time.Minute, func() error {
			if got := col.unique(); got < n/3 {
				return fmt.Errorf("handled %d of %d", got, n)
			}
			return nil
		})
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		if err := ks[0].Shutdown(sctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if err := <-done; err != nil && !errors.Is(err, omnibus.ErrClosed) {
			t.Fatalf("Run: %v", err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for len(col.missing(ids)) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		// A pull response the server sent as the member unsubscribed is
		// lost on the way: the server counts it delivered, and it comes
		// back after ack_wait. That is at most what one response holds
		// in flight; seen: 1 message in a few runs of 3,000.
		if m := col.missing(ids); len(m) > 1 {
			var state string
			if cons, err := rawJetStream(t, base).Consumer(ctx, topic, "g"); err == nil {
				ci := cons.CachedInfo()
				state = fmt.Sprintf("pending %d, ack pending %d, waiting %d, redelivered %d, ack floor %d, delivered %d",
					ci.NumPending, ci.NumAckPending, ci.NumWaiting, ci.NumRedelivered, ci.AckFloor.Stream, ci.Delivered.Stream)
			}
			t.Fatalf("%d of %d arrived within %v of the start; %d wait for ack_wait (consumer: %s)", n-len(m), n, time.Since(start).Round(time.Millisecond), len(m), state)
		}
		t.Logf("%d of %d arrived %v after the start", n-len(col.missing(ids)), n, time.Since(start).Round(time.Millisecond))
	})
}

// TestStalePullRequest leaves a pull request on a partition's consumer,
// as the lane's previous owner would if it froze past its lease while
// pulling: nothing is lost. On a server with pinned clients (2.11 and
// later: the embedded one) the request gets nothing, so order holds too;
// on an older one the message it takes comes back after ack_wait, behind
// newer ones.
func TestStalePullRequest(t *testing.T) {
	onServers(t, time.Minute, func(t *testing.T, ctx context.Context, base string) {
		const n = 20
		u := withParams(base, "partitions=4&lease_ttl=2s&rebalance_interval=100ms&ack_wait=2s")
		c := transporttest.Open(t, u)
		js := rawJetStream(t, u)
		topic := newTopic(ctx, t, c, base, 4)
		o := newStrictOrder()
		k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
			seq, err := o.begin(m)
			if err == nil {
				o.done(m, seq)
			}
			return err
		}, omnibus.Group("g"), omnibus.Order(omnibus.OrderKey))
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, k)
		holdsLanes(t, k, 4)
		cons, err := js.Consumer(ctx, topic, "g_p0")
		if err != nil {
			t.Fatal(err)
		}
		info := cons.CachedInfo()
		pinned := info.Config.PriorityPolicy == jetstream.PriorityPolicyPinned
		opts := []jetstream.FetchOpt{jetstream.FetchMaxWait(5 * time.Second)}
		if pinned {
			opts = append(opts, jetstream.FetchPriorityGroup(info.Config.PriorityGroups[0]))
		}
		stale, err := cons.Fetch(1, opts...)
		if err != nil {
			t.Fatal(err)
		}
		key := keysOn(0, 4, 1)[0]
		var ms []*omnibus.Message
		for i := 1; i <= n; i++ {
			ms = append(ms, &omnibus.Message{Key: key, Headers: map[string]string{"seq": strconv.Itoa(i)}, Body: []byte("x")})
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatal(err)
		}
		stolen := 0
		for range stale.Messages() {
			stolen++ // never acknowledged: the previous owner froze
		}
		eventually(t, 30*time.Second, func() error {
			if got := o.unique(); got < n {
				return fmt.Errorf("handled %d of %d (%d taken by the stale pull)", got, n, stolen)
			}
			return nil
		})
		o.mu.Lock()
		defer o.mu.Unlock()
		t.Logf("server pins clients: %v; the stale pull took %d; %d deliveries went back to an older message", pinned, stolen, o.backs)
		if pinned && (stolen > 0 || o.backs > 0) {
			t.Errorf("with a pinned consumer the stale pull took %d and %d deliveries went back (first: %s)", stolen, o.backs, o.first)
		}
	})
}

// TestMissingThrowawayConsumer deletes the consumer of a throwaway
// unpartitioned group (no name, no recorded positions) while it runs:
// nobody resumes such a group, so the subscription ends with ErrNotFound
// rather than starting again somewhere.
func TestMissingThrowawayConsumer(t *testing.T) {
	onServers(t, time.Minute, func(t *testing.T, ctx context.Context, base string) {
		c := transporttest.Open(t, base)
		js := rawJetStream(t, base)
		topic := newTopic(ctx, t, c, base, 1)
		k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- k.Run(ctx) }()
		eventually(t, 10*time.Second, func() error { return js.DeleteConsumer(ctx, topic, k.Group()) })
		select {
		case err := <-done:
			if !errors.Is(err, omnibus.ErrNotFound) {
				t.Fatalf("Run: %v, want an error wrapping ErrNotFound", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run goes on after its throwaway group's consumer was deleted")
		}
	})
}

// TestHeldNotRunIsNotCounted pulls a group's message four times without
// running or acknowledging it, as members that crashed while it waited
// behind a poisoned message would, and a pull the server answered after
// its client died: the server's delivery count is then 5. A member with
// MaxAttempts 3 must still run it (its count is the holders that ran it:
// the first, unrecorded, and this one), not dead-letter it, and
// acknowledging it deletes the record.
func TestHeldNotRunIsNotCounted(t *testing.T) {
	onServers(t, time.Minute, func(t *testing.T, ctx context.Context, base string) {
		u := withParams(base, "ack_wait=1s")
		c := transporttest.Open(t, u)
		js := rawJetStream(t, u)
		topic := newTopic(ctx, t, c, base, 1)
		if err := c.CreateTopic(ctx, topic+".dlq", 1); err != nil {
			t.Fatal(err)
		}
		// The group's consumer, made by a member that joined and left.
		first, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- first.Run(rctx) }()
		holdsLanes(t, first, 1)
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}

		id := publishTo(t, c, topic, []string{"k"})[0]
		cons, err := js.Consumer(ctx, natsbus.StreamName(topic), "g")
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for m := range batch.Messages() {
				md, _ := m.Metadata()
				if md.NumDelivered != uint64(i+1) {
					t.Fatalf("pull %d: delivery count %d", i+1, md.NumDelivered)
				}
				got++ // held, never run, never acknowledged
			}
			if got != 1 {
				t.Fatalf("pull %d got %d messages, want 1", i+1, got)
			}
			time.Sleep(1200 * time.Millisecond) // past ack_wait
		}

		var mu sync.Mutex
		var attempts []int
		k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
			mu.Lock()
			attempts = append(attempts, m.Attempt)
			mu.Unlock()
			return nil
		}, omnibus.Group("g"), omnibus.MaxAttempts(3))
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, k)
		eventually(t, 20*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(attempts) == 0 {
				return fmt.Errorf("message %s, pulled 4 times and never run, was not handled", id)
			}
			return nil
		})
		mu.Lock()
		if len(attempts) != 1 || attempts[0] != 2 {
			t.Errorf("the handler saw attempts %v, want [2] (the first holder and this one)", attempts)
		}
		mu.Unlock()
		kv, err := js.KeyValue(ctx, natsbus.PositionBucket(topic, "g"))
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, func() error {
			keys, err := kv.ListKeysFiltered(ctx, "r.>")
			if err != nil {
				return err
			}
			var left []string
			for key := range keys.Keys() {
				left = append(left, key)
			}
			if len(left) > 0 {
				return fmt.Errorf("run counts left after the ack: %v", left)
			}
			return nil
		})
	})
}

// TestReclaimNotCounted takes a lane's lease away from a member behind
// its back while it handles the lane's first message, and lets it claim
// the lane again: alive, it did not crash on that message, so the
// message's next run is not counted as another holder's (attempt 1, not
// 2) and the lane is not guarded.
func TestReclaimNotCounted(t *testing.T) {
	onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
		u := withParams(base, testParams)
		c := transporttest.Open(t, u)
		js := rawJetStream(t, u)
		topic := newTopic(ctx, t, c, base, 4)
		var mu sync.Mutex
		var attempts []int
		running := make(chan struct{}, 1)
		k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
			mu.Lock()
			attempts = append(attempts, m.Attempt)
			first := len(attempts) == 1
			mu.Unlock()
			if !first {
				return nil
			}
			running <- struct{}{}
			<-ctx.Done() // the lane is lost
			return ctx.Err()
		}, omnibus.Group("g"), omnibus.DrainTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, k)
		holdsLanes(t, k, 4)
		publishTo(t, c, topic, keysOn(0, 4, 1))
		select {
		case <-running:
		case <-time.After(15 * time.Second):
			t.Fatal("the message was not handled")
		}
		purgeLease(ctx, t, js, topic, "g", 0)
		eventually(t, 30*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(attempts) < 2 {
				return fmt.Errorf("handled %d times; want a second run after the lane was claimed again", len(attempts))
			}
			return nil
		})
		mu.Lock()
		defer mu.Unlock()
		if attempts[1] != 1 {
			t.Errorf("attempts seen %v: the member's own earlier run was counted as another holder's", attempts)
		}
	})
}

// TestReclaimHandlesNothingTwice takes a lane's lease away from its only
// member while the lane's first message is still being handled (its
// handler waits) and the messages of other keys behind it were handled
// and acknowledged, out of order: the member claims the lane again, and
// the reset redelivers all of them, from the first message not
// acknowledged. What the member handled and acknowledged must not be
// handled again; the message that was not settled must.
func TestReclaimHandlesNothingTwice(t *testing.T) {
	onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
		u := withParams(base, testParams)
		js := rawJetStream(t, u)
		reclaimHandlesNothingTwice(t, ctx, base, u, func(topic string, _ *atomic.Int64) { purgeLease(ctx, t, js, topic, "g", 0) })
	})
}

// TestRestartBetweenLossAndReclaim is TestReclaimHandlesNothingTwice with
// the lane lost another way: the server (a private one, restarted with
// its store) stops, so the member cannot refresh its leases and loses
// them at their deadline; the server starts again, the leases expire on
// it, and the member claims its lanes again, lane 0 reset at its ack
// floor. What the member acknowledged out of order before the restart
// must not reach the handler again (the server kept the consumer's
// state; the member kept what it acknowledged), nothing may be lost, and
// the unsettled first message runs again. A guard: it passed on the code
// it was written against; it fails if the member forgets its lanes'
// acknowledgements when the connection drops or a lane is lost.
func TestRestartBetweenLossAndReclaim(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): restart test")
	}
	srv := startPrivateServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := withParams(srv.url(), testParams+"&reconnect_wait=100ms")
	reclaimHandlesNothingTwice(t, ctx, srv.url(), u, func(_ string, lost *atomic.Int64) {
		srv.stop()
		eventually(t, 15*time.Second, func() error {
			if lost.Load() == 0 {
				return errors.New("the member did not lose its lanes while the server was down")
			}
			return nil
		})
		srv.start()
	})
}

// reclaimHandlesNothingTwice runs a member of group "g" on u (a topic of
// four lanes on base) whose lane 0 has its first message unsettled (the
// handler waits) and the messages of other keys behind it handled and
// acknowledged; loseLane(topic, lost) then has the member lose lane 0
// (lost counts the lanes the engine was told were lost) and claim it
// again. The reset redelivers from the unsettled message: it must run
// again, and nothing else twice.
func reclaimHandlesNothingTwice(t *testing.T, ctx context.Context, base, u string, loseLane func(topic string, lost *atomic.Int64)) {
	t.Helper()
	c := transporttest.Open(t, u)
	topic := newTopic(ctx, t, c, base, 4)
	keys := keysOn(0, 4, 21)
	release := make(chan struct{})
	var mu sync.Mutex
	seen := map[string]int{}
	blockerRuns := 0
	var lost atomic.Int64
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		if m.Key == keys[0] {
			mu.Lock()
			blockerRuns++
			mu.Unlock()
			select {
			case <-release:
			case <-ctx.Done(): // the lane is lost
				return ctx.Err()
			}
		}
		mu.Lock()
		seen[m.ID]++
		mu.Unlock()
		return nil
	}, omnibus.Group("g"), omnibus.MaxInFlight(8), omnibus.DrainTimeout(100*time.Millisecond),
		omnibus.Observe(func(e omnibus.Event) {
			if e.Kind == omnibus.EventLost {
				lost.Add(1)
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	holdsLanes(t, k, 4)
	handled := func(ids []string) error {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if seen[id] == 0 {
				return fmt.Errorf("message %s not handled", id)
			}
		}
		return nil
	}
	blocker := publishTo(t, c, topic, keys[:1])
	eventually(t, 15*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if blockerRuns == 0 {
			return errors.New("the lane's first message is not being handled")
		}
		return nil
	})
	behind := publishTo(t, c, topic, keys[1:])
	eventually(t, 15*time.Second, func() error { return handled(behind) })
	loseLane(topic, &lost)
	eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if lost.Load() == 0 || blockerRuns < 2 {
			return fmt.Errorf("%d lanes lost, the lane's first message run %d times; want it lost and the message run again", lost.Load(), blockerRuns)
		}
		return nil
	})
	// What the reset redelivers comes in the lane's order: once a
	// message published now is handled, the rest came before it.
	after := publishTo(t, c, topic, keys[1:2])
	eventually(t, 15*time.Second, func() error { return handled(after) })
	close(release)
	eventually(t, 15*time.Second, func() error { return handled(blocker) })
	mu.Lock()
	defer mu.Unlock()
	var twice []string
	for _, id := range append(append(blocker, behind...), after...) {
		if seen[id] > 1 {
			twice = append(twice, id)
		}
	}
	if len(twice) > 0 {
		t.Errorf("%d of %d messages handled twice after the member claimed its lane again, e.g. %v: a message it handled and acknowledged came to its handler again",
			len(twice), 2+len(behind), twice[:min(5, len(twice))])
	}
}

// TestGuardedLaneDeadLetterStuck has a member close while the dead
// letter of its lane's first message cannot land (the dead-letter
// topic's stream takes nothing over 16 bytes), so that the lane's next owner, another member, finds
// the message begun by a previous holder and guards the lane (one
// message at a time). The message fails for good again and its dead
// letter again does not land: it must hold its key only, as it does
// anywhere else; the lane's other keys go on.
func TestGuardedLaneDeadLetterStuck(t *testing.T) {
	onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
		u := withParams(base, testParams)
		c := transporttest.Open(t, u)
		topic := newTopic(ctx, t, c, base, 4)
		keys := keysOn(0, 4, 6)
		poison, healthy := keys[0], keys[1:]
		col := newCollector()
		var tries atomic.Int64
		h := func(ctx context.Context, m *omnibus.Message) error {
			if m.Key == poison {
				tries.Add(1)
				return omnibus.Permanent(errors.New("poison"))
			}
			return col.handle(ctx, m)
		}
		dlq := topic + "-dlq"
		if _, err := rawJetStream(t, u).CreateStream(ctx, jetstream.StreamConfig{
			Name: natsbus.StreamName(dlq), Subjects: []string{dlq}, MaxMsgSize: 16,
		}); err != nil {
			t.Fatal(err)
		}
		opts := []omnibus.SubscribeOption{omnibus.Group("g"), omnibus.DeadLetterTopic(dlq),
			omnibus.Backoff(10*time.Millisecond, 200*time.Millisecond), omnibus.DrainTimeout(500 * time.Millisecond)}
		a, err := transporttest.Open(t, u).Subscribe(ctx, topic, h, opts...)
		if err != nil {
			t.Fatal(err)
		}
		stopA := runLeavingPoison(t, a, false)
		holdsLanes(t, a, 4)
		publishTo(t, c, topic, []string{poison})
		eventually(t, 15*time.Second, func() error {
			if tries.Load() == 0 {
				return errors.New("the poison message was not handled")
			}
			return nil
		})
		stopA()
		_ = a.Close()

		before := tries.Load()
		b, err := transporttest.Open(t, u).Subscribe(ctx, topic, h, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(runLeavingPoison(t, b, false))
		var ids []string
		for range 4 {
			ids = append(ids, publishTo(t, c, topic, healthy)...)
		}
		col.waitAll(t, ids, 30*time.Second)
		if tries.Load() == before {
			t.Errorf("the poison message did not run again on the lane's next owner")
		}
	})
}

// TestHandOverBehindFailingMessage: two members of a group, each on a
// client of its own. Member A holds the four lanes; lane 0's first
// message fails on A every time (retried in place, slowly), so the
// lane's ack floor stays below it while A handles and acknowledges the
// lane's later messages of other keys, out of order. Then B joins (A
// gives two lanes up, one at a time, each drained within its bound) and
// A closes: B claims every lane, and lane 0's reset redelivers from the
// failing message, which B handles ("Retried") or which fails on B too
// until it is dead-lettered after its attempts ("DeadLettered": A counts
// as one of its holders). Nothing may be lost; no key's message may be
// handled for the first time after a newer one of its key was settled
// (keyOrder, across the group; the dead-lettered message counts as
// settled on its last attempt); and the only messages handled twice are
// those doc.go allows on a hand-over to another member: lane 0's
// messages above the failing one that A acknowledged out of order, once
// by A and once by B. A guard: it passed on the code it was written
// against; it fails if a hand-over loses a message, if a reset does not
// start at the ack floor (the failing message, or its key's next, would
// come after newer ones: it failed so with prepare's reset skipped), or
// if a lane given up redelivers what was acknowledged in order.
func TestHandOverBehindFailingMessage(t *testing.T) {
	for _, deadLetter := range []bool{false, true} {
		name := map[bool]string{false: "Retried", true: "DeadLettered"}[deadLetter]
		t.Run(name, func(t *testing.T) {
			onServers(t, 2*time.Minute, func(t *testing.T, ctx context.Context, base string) {
				handOverBehindFailingMessage(t, ctx, base, deadLetter)
			})
		})
	}
}

// handOverBehindFailingMessage is TestHandOverBehindFailingMessage on
// base; with deadLetter, the failing message is dead-lettered by B.
func handOverBehindFailingMessage(t *testing.T, ctx context.Context, base string, deadLetter bool) {
	u := withParams(base, testParams)
	pub := transporttest.Open(t, u)
	topic := newTopic(ctx, t, pub, base, 4)
	lane0 := keysOn(0, 4, 6)
	poison, others := lane0[0], lane0[1:]
	var elsewhere []string
	for p := 1; p < 4; p++ {
		elsewhere = append(elsewhere, keysOn(p, 4, 2)...)
	}

	order := newKeyOrder()
	var mu sync.Mutex
	by := map[string][]string{} // per ID, the members that handled it
	onA := map[string]uint64{}  // lane 0's messages A handled: their positions
	var poisonAt uint64         // the failing message's position
	const attemptsOnB = 3
	handler := func(member string) omnibus.Handler {
		return func(ctx context.Context, m *omnibus.Message) error {
			pos, _ := strconv.ParseUint(m.Position, 10, 64)
			failing := m.Key == poison && m.Headers["seq"] == "1"
			if failing && member == "A" {
				mu.Lock()
				poisonAt = pos
				mu.Unlock()
				return errors.New("failing on A")
			}
			if failing && deadLetter {
				if m.Attempt < attemptsOnB {
					return errors.New("failing on B")
				}
				// Its last attempt: the engine dead-letters it, which
				// settles it.
				_ = order.handle(ctx, m)
				mu.Lock()
				by[m.ID] = append(by[m.ID], member)
				mu.Unlock()
				return errors.New("failing on B for good")
			}
			if err := order.handle(ctx, m); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			by[m.ID] = append(by[m.ID], member)
			if member == "A" && m.Lane == "0" {
				onA[m.ID] = pos
			}
			return nil
		}
	}
	handled := func(ids []string) error {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if len(by[id]) == 0 {
				return fmt.Errorf("message %s not handled", id)
			}
		}
		return nil
	}
	opts := []omnibus.SubscribeOption{omnibus.Group("g"), omnibus.MaxAttempts(1000),
		omnibus.Backoff(50*time.Millisecond, 200*time.Millisecond), omnibus.DrainTimeout(500 * time.Millisecond)}
	a, err := transporttest.Open(t, u).Subscribe(ctx, topic, handler("A"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	stopA := runLeavingPoison(t, a, true)
	holdsLanes(t, a, 4)

	seqs := keySeqs{}
	ids := publishMsgs(t, pub, topic, seqs.next(poison))
	eventually(t, 15*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if poisonAt == 0 {
			return errors.New("the failing message was not tried")
		}
		return nil
	})
	var behind []string // not of the failing message's key
	for range 5 {
		round := publishMsgs(t, pub, topic, seqs.next(append(others, elsewhere...)...))
		behind = append(behind, round...)
		ids = append(append(ids, round...), publishMsgs(t, pub, topic, seqs.next(poison))...)
	}
	eventually(t, 20*time.Second, func() error { return handled(behind) })

	if deadLetter {
		if err := pub.CreateTopic(ctx, topic+".dlq", 1); err != nil {
			t.Fatal(err)
		}
	}
	b, err := transporttest.Open(t, u).Subscribe(ctx, topic, handler("B"), append(opts, omnibus.MaxAttempts(attemptsOnB))...)
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, b)
	holdsLanes(t, b, 2)
	ids = append(ids, publishMsgs(t, pub, topic, seqs.next(append(lane0, elsewhere...)...))...)
	stopA()
	if err := a.Close(); err != nil {
		t.Fatalf("Close A: %v", err)
	}
	holdsLanes(t, b, 4)
	ids = append(ids, publishMsgs(t, pub, topic, seqs.next(append(lane0, elsewhere...)...))...)
	eventually(t, 30*time.Second, func() error { return handled(ids) })

	order.mu.Lock()
	if len(order.errs) > 0 {
		t.Errorf("key order broken %d times across the group, e.g. %v", len(order.errs), order.errs[:min(5, len(order.errs))])
	}
	order.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	allowed, bad := 0, []string{}
	for id, ms := range by {
		if len(ms) < 2 {
			continue
		}
		if pos, ok := onA[id]; ok && len(ms) == 2 && ms[0] == "A" && ms[1] == "B" && pos > poisonAt {
			allowed++
			continue
		}
		bad = append(bad, fmt.Sprintf("%s by %v", id, ms))
	}
	if len(bad) > 0 {
		t.Errorf("%d messages handled twice beyond what a hand-over allows (lane 0's above its failing message, acknowledged out of order by A, then handled by B), e.g. %v",
			len(bad), bad[:min(5, len(bad))])
	}
	if deadLetter {
		info, err := rawJetStream(t, u).Stream(ctx, natsbus.StreamName(topic+".dlq"))
		if err != nil {
			t.Fatal(err)
		}
		if n := info.CachedInfo().State.Msgs; n != 1 {
			t.Errorf("%d dead letters, want 1 (the failing message's)", n)
		}
	}
	t.Logf("%d unique IDs handled of %d published; %d handled again by B after the hand-over, as doc.go allows", len(by), len(ids), allowed)
}

// runLeavingPoison runs k in the background; the function it returns
// stops it and waits, its Run having to end with the poison message
// unsettled (or, with mayHandOver, having settled everything: the
// poison's lane may have gone to another member before).
func runLeavingPoison(t *testing.T, k *omnibus.Consumer, mayHandOver bool) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	return func() {
		cancel()
		var unsettled *omnibus.UnsettledError
		if err := <-done; !errors.As(err, &unsettled) && (err != nil || !mayHandOver) {
			t.Errorf("Run: %v, want the poison message left unsettled", err)
		}
	}
}

// purgeLease takes the lease of partition part of topic's group away
// behind its holder's back: the bucket forgets it, and a member may claim
// it again.
func purgeLease(ctx context.Context, t *testing.T, js jetstream.JetStream, topic, group string, part int) {
	t.Helper()
	kv, err := js.KeyValue(ctx, natsbus.LeaseBucket(topic, group))
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "p."+strconv.Itoa(part)); err != nil {
		t.Fatal(err)
	}
}

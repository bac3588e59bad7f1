package natsbus_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// keyOrder checks per-key order across every member of a group: each key's
// messages carry a sequence 1, 2, ...; a sequence already handled may come
// again (a redelivery), but going back to one not yet handled, or skipping
// ahead, is a failure.
type keyOrder struct {
	mu      sync.Mutex
	ids     map[string]int
	last    map[string]int // highest sequence handled, per key
	repeats int
	errs    []string
}

func newKeyOrder() *keyOrder { return &keyOrder{ids: map[string]int{}, last: map[string]int{}} }

func (o *keyOrder) handle(_ context.Context, m *omnibus.Message) error {
	time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
	seq, err := strconv.Atoi(m.Headers["seq"])
	if err != nil {
		return omnibus.Permanent(err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ids[m.ID]++
	last := o.last[m.Key]
	switch {
	case seq <= last:
		o.repeats++ // every sequence up to last was handled: a redelivery
	case seq == last+1:
		o.last[m.Key] = seq
	default:
		o.errs = append(o.errs, fmt.Sprintf("key %s: sequence %d after %d (lane %s, attempt %d)", m.Key, seq, last, m.Lane, m.Attempt))
	}
	return nil
}

func (o *keyOrder) unique() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ids)
}

// keySeqs numbers each key's messages 1, 2, ... in the seq header
// keyOrder reads.
type keySeqs map[string]int

// next returns a message of each of keys, numbered after the key's last.
func (s keySeqs) next(keys ...string) []*omnibus.Message {
	ms := make([]*omnibus.Message, len(keys))
	for i, k := range keys {
		s[k]++
		ms[i] = &omnibus.Message{Key: k, Headers: map[string]string{"seq": strconv.Itoa(s[k])}, Body: []byte("x")}
	}
	return ms
}

// publishKeyed publishes n messages over keys keys in batches, each
// message with its per-key sequence in the seq header, pausing between
// batches so that consumers work while it goes on.
func publishKeyed(ctx context.Context, c *omnibus.Client, topic string, n, keys int) ([]string, error) {
	seqs := keySeqs{}
	var ids []string
	const batch = 250
	for i := 0; i < n; i += batch {
		var ks []string
		for j := i; j < min(n, i+batch); j++ {
			ks = append(ks, "k"+strconv.Itoa(j%keys))
		}
		ms := seqs.next(ks...)
		if err := c.Publish(ctx, topic, ms...); err != nil {
			return ids, err
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ids, nil
}

// testParams make leases and rebalances react in test time.
const testParams = "partitions=4&lease_ttl=2s&rebalance_interval=100ms&ack_wait=5s"

func withParams(base, params string) string {
	if strings.Contains(base, "?") {
		return base + "&" + params
	}
	return base + "?" + params
}

// testKeyOrderAcrossMembers runs a group of three members, each on its own
// client (as separate processes would be), over 10,000 messages of 200
// keys; one member leaves mid-stream (gracefully, or by losing its
// connection when crash is set, so its leases expire). Nothing may be
// lost, and each key's messages must be handled in order across members.
func testKeyOrderAcrossMembers(t *testing.T, base string, crash bool) {
	const n, keys = 10000, 200
	u := withParams(base, testParams)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub := transporttest.Open(t, u)
	topic := topicName(t, base)
	if err := pub.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	o := newKeyOrder()
	var evMu sync.Mutex
	events := map[omnibus.EventKind]int{}
	observe := omnibus.Observe(func(e omnibus.Event) {
		switch e.Kind {
		case omnibus.EventClaimed, omnibus.EventRevoked, omnibus.EventLost:
			evMu.Lock()
			events[e.Kind] += len(e.Lanes)
			evMu.Unlock()
		}
	})
	var ks []*omnibus.Consumer
	var leaver *omnibus.Client
	cut := func() {}
	for i := range 3 {
		var c *omnibus.Client
		if crash && i == 1 {
			dc, nc, err := natsbus.OpenConn(ctx, u)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			if c, err = omnibus.New(dc); err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() { _ = c.Close() })
			cut = nc.Close
		} else {
			c = transporttest.Open(t, u)
		}
		if i == 1 {
			leaver = c
		}
		k, err := c.Subscribe(ctx, topic, o.handle, omnibus.Group("order"), omnibus.StartFrom(omnibus.StartEarliest),
			omnibus.Order(omnibus.OrderKey), omnibus.MaxInFlight(64), omnibus.DrainTimeout(5*time.Second), observe)
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		transporttest.RunConsumer(t, k)
		ks = append(ks, k)
	}
	type result struct {
		ids []string
		err error
	}
	published := make(chan result, 1)
	go func() {
		ids, err := publishKeyed(ctx, pub, topic, n, keys)
		published <- result{ids, err}
	}()
	eventually(t, time.Minute, func() error {
		if got := o.unique(); got < n/3 {
			return fmt.Errorf("handled %d of %d before the member was to leave", got, n)
		}
		return nil
	})
	eventually(t, 10*time.Second, func() error {
		if len(ks[1].Stats().Lanes) == 0 {
			return fmt.Errorf("the member to leave holds no lane: %+v", ks[1].Stats())
		}
		return nil
	})
	if crash {
		cut() // the member's leases expire; it cannot acknowledge what it handled
	} else if err := leaver.Close(); err != nil {
		t.Fatalf("Close of the leaving member: %v", err)
	}
	r := <-published
	if r.err != nil {
		t.Fatalf("publish: %v", r.err)
	}
	eventually(t, time.Minute, func() error {
		if got := o.unique(); got < n {
			return fmt.Errorf("handled %d of %d unique IDs after a member left", got, n)
		}
		return nil
	})
	evMu.Lock()
	lost := events[omnibus.EventLost]
	t.Logf("lane events: %d claimed, %d revoked, %d lost", events[omnibus.EventClaimed], events[omnibus.EventRevoked], lost)
	evMu.Unlock()
	if crash && lost == 0 {
		t.Errorf("the member whose connection was cut reported no lost lane")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range r.ids {
		if o.ids[id] == 0 {
			t.Fatalf("message %s lost", id)
		}
	}
	if len(o.errs) > 0 {
		t.Fatalf("%d per-key order violations, e.g.:\n%s", len(o.errs), strings.Join(o.errs[:min(10, len(o.errs))], "\n"))
	}
	t.Logf("%d messages, %d keys, 3 members (one left, crash %v): none lost, key order held, %d redeliveries", n, keys, crash, o.repeats)
}

func TestPartitionedKeyOrderExternal(t *testing.T) {
	testKeyOrderAcrossMembers(t, externalURL(t), false)
}

func TestPartitionedKeyOrderEmbedded(t *testing.T) {
	testKeyOrderAcrossMembers(t, natsbus.EmbeddedURL(t.TempDir()), false)
}

func TestPartitionedKeyOrderCrashExternal(t *testing.T) {
	testKeyOrderAcrossMembers(t, externalURL(t), true)
}

// TestGroupLag reads a group's lag per lane from a client outside the
// group, on both layouts, and ErrNotFound for what does not exist.
func TestGroupLag(t *testing.T) {
	base := externalURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tt := range []struct {
		name  string
		url   string
		lanes int
	}{
		{"Unpartitioned", base, 1},
		{"Partitioned", withParams(base, testParams), 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := transporttest.Open(t, tt.url)
			topic := topicName(t, base)
			if _, err := c.Lag(ctx, topic, "g"); !errors.Is(err, omnibus.ErrNotFound) {
				t.Fatalf("Lag of a missing topic: got %v, want ErrNotFound", err)
			}
			if err := c.CreateTopic(ctx, topic, tt.lanes); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Lag(ctx, topic, "g"); !errors.Is(err, omnibus.ErrNotFound) {
				t.Fatalf("Lag of a missing group: got %v, want ErrNotFound", err)
			}
			// The group exists (its consumers), but nobody reads.
			k, err := transporttest.Open(t, tt.url).Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil },
				omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest))
			if err != nil {
				t.Fatal(err)
			}
			members := func() (int, error) {
				return c.Driver().(interface {
					GroupMembers(ctx context.Context, topic, group string) (int, error)
				}).GroupMembers(ctx, topic, "g")
			}
			// A subscribed member pulls (unpartitioned) and heartbeats
			// (partitioned) before Run: soon after Subscribe.
			var got int
			var merr error
			transporttest.Eventually(t, 10*time.Second, func() bool {
				got, merr = members()
				return merr == nil && got == 1
			}, func() string { return fmt.Sprintf("GroupMembers with one member: %d, %v; want 1", got, merr) })
			if err := k.Close(); err != nil {
				t.Fatal(err)
			}
			if got, err := members(); err != nil || got != 0 {
				t.Errorf("GroupMembers after the member left: %d, %v; want 0", got, err)
			}
			const n = 100
			publishN(t, c, topic, n, 8)
			lags, err := c.Lag(ctx, topic, "g")
			if err != nil {
				t.Fatalf("Lag: %v", err)
			}
			var sum int64
			for i, l := range lags {
				if l.Lane != strconv.Itoa(i) || !l.Known {
					t.Errorf("lane %d: %+v, want lane %d known", i, l, i)
				}
				sum += l.Lag
			}
			if len(lags) != tt.lanes || sum != n {
				t.Errorf("lags %+v: %d lanes summing to %d, want %d lanes summing to %d", lags, len(lags), sum, tt.lanes, n)
			}
		})
	}
}

// TestEphemeralGroupLeavesNothing checks that a throwaway group's
// consumers (and lease bucket) are gone once its members close.
func TestEphemeralGroupLeavesNothing(t *testing.T) {
	base := externalURL(t)
	for _, tt := range []struct{ name, url string }{
		{"Unpartitioned", base},
		{"Partitioned", withParams(base, testParams)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := transporttest.Open(t, tt.url)
			topic := topicName(t, base)
			col := newCollector()
			k, err := c.Subscribe(ctx, topic, col.handle, omnibus.Members(2))
			if err != nil {
				t.Fatal(err)
			}
			kctx, kcancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- k.Run(kctx) }()
			time.Sleep(300 * time.Millisecond) // let the members join
			publishN(t, c, topic, 50, 8)
			col.waitFor(t, 50, 30*time.Second)
			kcancel()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			nc, err := nats.Connect(base)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			var left []string
			st, err := js.Stream(ctx, topic) // the topic is a valid stream name
			if err != nil {
				t.Fatal(err)
			}
			for name := range st.ConsumerNames(ctx).Name() {
				left = append(left, "consumer "+name)
			}
			for name := range js.StreamNames(ctx).Name() {
				if strings.HasPrefix(name, "KV_"+topicRE.ReplaceAllString(topic, "_")) {
					left = append(left, "bucket "+name)
				}
			}
			if len(left) > 0 {
				t.Errorf("a throwaway group left %v behind", left)
			}
		})
	}
}

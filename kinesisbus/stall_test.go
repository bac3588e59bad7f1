package kinesisbus_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestStalledHolderStopsBeforeTakeover: two members (each its own
// client, as two processes) share a stream of 4 shards, 2 each, while
// keyed records keep coming. The second member's DynamoDB connection
// then stalls (a proxy that stops forwarding: its renewals and
// checkpoints neither fail nor return), while it can still read
// Kinesis. The first member takes the stalled member's leases once
// their counters have stood still for failover_time; the stalled member
// must have stopped handing records of those shards to its handlers
// before that: no record of a shard reaches a handler of the stalled
// member after the first member began handling the shard. Nothing is
// lost, and a record is handled twice only on a shard that moved.
//
// It times a takeover, so it runs alone, before the parallel tests.
func TestStalledHolderStopsBeforeTakeover(t *testing.T) {
	need(t)
	const failover = 3 * time.Second
	params := "failover_time=" + failover.String()
	pub := transporttest.Open(t, testURL(""))
	stream := testPrefix + "stall-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := pub.CreateTopic(ctxT(t), stream, 4); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}

	type handling struct {
		member int
		lane   string
		id     string
		at     time.Time
	}
	var mu sync.Mutex
	var log []handling
	handler := func(member int) omnibus.Handler {
		return func(_ context.Context, m *omnibus.Message) error {
			mu.Lock()
			log = append(log, handling{member: member, lane: m.Lane, id: m.ID, at: time.Now()})
			mu.Unlock()
			return nil
		}
	}
	ddb := newProxy(t, dynamoAddr)
	urls := []string{testURL(params), kinesisURL(kinesisAddr, ddb.Addr(), params)}
	ks := make([]*omnibus.Consumer, 2)
	stops := make([]func(), 2)
	for i, u := range urls {
		c := transporttest.Open(t, u)
		k, err := c.Subscribe(ctxT(t), stream, handler(i), omnibus.Group("stall"), omnibus.StartFrom(omnibus.StartEarliest))
		if err != nil {
			t.Fatalf("Subscribe %d: %v", i, err)
		}
		t.Cleanup(func() { _ = k.Close() })
		ks[i] = k
		stops[i] = transporttest.RunConsumer(t, k)
	}

	// Keyed records all along: 16 keys every 50ms.
	stopPublishing := publishKeyed(t, pub, stream, 16)
	defer stopPublishing()

	transporttest.Eventually(t, 30*time.Second, func() bool {
		return slices.Equal(holders(ks), []int{2, 2})
	}, func() string { return fmt.Sprintf("lanes per member %v, want 2/2", holders(ks)) })
	var moved []string
	for _, l := range ks[1].Stats().Lanes {
		if l.Member >= 0 {
			moved = append(moved, l.Lane)
		}
	}
	// Both members handle records of their shards before the stall.
	time.Sleep(time.Second)

	stalled := time.Now()
	ddb.Pause()
	transporttest.Eventually(t, 30*time.Second, func() bool {
		return holders(ks)[0] == 4
	}, func() string { return fmt.Sprintf("lanes per member %v, want all 4 on the first", holders(ks)) })
	took := time.Since(stalled)
	// The stalled member reported them lost before (Lanes.Lost).
	if c := holders(ks); c[1] != 0 {
		t.Errorf("lanes per member %v once the first took all 4: the stalled member still holds %d", c, c[1])
	}
	// Give a stalled member that goes on reading time to show it.
	time.Sleep(failover)

	// For each shard the stalled member held: when the first member
	// began handling it after the stall (it held them all at the start,
	// before the second member asked for its share), and what the
	// stalled member handled after that.
	mu.Lock()
	var overlap time.Duration
	late := 0
	gap := time.Duration(-1) // the least time between the stalled member's last and the taker's first handling of a shard
	for _, lane := range moved {
		var first time.Time
		for _, h := range log {
			if h.member == 0 && h.lane == lane && h.at.After(stalled) && (first.IsZero() || h.at.Before(first)) {
				first = h.at
			}
		}
		if first.IsZero() {
			t.Errorf("the first member handled nothing of shard %s after it took it", lane)
			continue
		}
		for _, h := range log {
			switch {
			case h.member != 1 || h.lane != lane:
			case !h.at.Before(first):
				late++
				overlap = max(overlap, h.at.Sub(first))
			case gap < 0 || first.Sub(h.at) < gap:
				gap = first.Sub(h.at)
			}
		}
	}
	mu.Unlock()
	t.Logf("stalled member's leases taken %v after the stall (failover_time %v); stalled member handled %d records of them after the taker began, up to %v after; least gap between its last and the taker's first handling of a shard %v",
		took.Round(time.Millisecond), failover, late, overlap.Round(time.Millisecond), gap.Round(time.Millisecond))
	if late > 0 {
		t.Errorf("the stalled member handled %d records of shards %v after the member that took them began handling them (up to %v after), want none",
			late, moved, overlap.Round(time.Millisecond))
	}

	// The stalled member goes away (its network cut); the first member
	// handles everything published.
	ddb.Cut()
	stops[1]()
	want := stopPublishing()
	handled := func() map[string][]handling {
		mu.Lock()
		defer mu.Unlock()
		byID := map[string][]handling{}
		for _, h := range log {
			byID[h.id] = append(byID[h.id], h)
		}
		return byID
	}
	transporttest.Eventually(t, 30*time.Second, func() bool {
		byID := handled()
		for _, id := range want {
			if len(byID[id]) == 0 {
				return false
			}
		}
		return true
	}, func() string {
		byID := handled()
		missing := 0
		for _, id := range want {
			if len(byID[id]) == 0 {
				missing++
			}
		}
		return fmt.Sprintf("%d of %d published records never handled", missing, len(want))
	})
	dups := 0
	for id, hs := range handled() {
		if len(hs) < 2 {
			continue
		}
		dups++
		if !slices.Contains(moved, hs[0].lane) {
			t.Errorf("record %s of shard %s, which did not move, handled %d times", id, hs[0].lane, len(hs))
		}
	}
	t.Logf("%d records published, all handled; %d handled twice or more, all on shards that moved (%v)", len(want), dups, moved)
}

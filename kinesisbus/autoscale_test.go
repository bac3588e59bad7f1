package kinesisbus_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestAutoscaleCappedAtShards: the autoscaler grows a group reading a
// backlog on 3 shards, from the time lag, to 3 members and no more (a
// shard is read by one member), drains it, and shrinks back to 1.
func TestAutoscaleCappedAtShards(t *testing.T) {
	need(t)
	t.Parallel()
	const n, shards = 3000, 3
	c := transporttest.Open(t, testURL(""))
	stream := testPrefix + "autoscale-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := c.CreateTopic(ctxT(t), stream, shards); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	var ids []string
	for i := 0; i < n; i += 500 {
		ms := make([]*omnibus.Message, 500)
		for j := range ms {
			ms[j] = &omnibus.Message{Key: "k" + strconv.Itoa(i+j), Body: []byte("x")}
		}
		if err := c.Publish(ctxT(t), stream, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	k, err := c.Subscribe(ctxT(t), stream, func(_ context.Context, m *omnibus.Message) error {
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		seen[m.ID] = true
		mu.Unlock()
		return nil
	}, omnibus.Group("scaled"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.MaxInFlight(1), omnibus.Order(omnibus.OrderLane))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	var dmu sync.Mutex
	var decisions []autoscale.Decision
	ctl, err := autoscale.New(k, autoscale.Policy{
		TargetLag: 100, // milliseconds of lag per member
		Interval:  200 * time.Millisecond, UpCooldown: 300 * time.Millisecond, DownDelay: time.Second, StallAfter: 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnDecision: func(d autoscale.Decision) {
			dmu.Lock()
			decisions = append(decisions, d)
			dmu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("autoscale.New: %v", err)
	}
	transporttest.RunConsumer(t, k)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = ctl.Run(ctx) }()
	peak := 0
	transporttest.Eventually(t, 90*time.Second, func() bool {
		peak = max(peak, k.Members())
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}, func() string { return fmt.Sprintf("handled %d of %d with %d members", len(seen), n, k.Members()) })
	transporttest.Eventually(t, 30*time.Second, func() bool { return k.Members() == 1 }, func() string {
		return fmt.Sprintf("%d members after the backlog drained, want 1", k.Members())
	})
	mu.Lock()
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("message %s lost", id)
		}
	}
	mu.Unlock()
	dmu.Lock()
	defer dmu.Unlock()
	maxDesired, capSeen := 0, 0
	for _, d := range decisions {
		maxDesired, capSeen = max(maxDesired, d.Desired), max(capSeen, d.Cap)
		if d.Current > shards {
			t.Errorf("decision %+v: %d members on %d shards", d, d.Current, shards)
		}
	}
	if peak != shards || capSeen != shards {
		t.Errorf("peak %d members, cap %d; want both %d (the shard count)", peak, capSeen, shards)
	}
	t.Logf("%d messages; peak %d members (cap %d, largest size asked %d) over %d decisions", n, peak, capSeen, maxDesired, len(decisions))
}

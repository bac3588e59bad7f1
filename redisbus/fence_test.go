package redisbus

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// lanesLog records the Lanes calls a member gets.
type lanesLog struct {
	mu                     sync.Mutex
	claimed, revoked, lost []string
}

func (l *lanesLog) Claimed(ls []string) {
	l.mu.Lock()
	l.claimed = append(l.claimed, ls...)
	l.mu.Unlock()
}
func (l *lanesLog) Revoked(_ context.Context, ls []string) {
	l.mu.Lock()
	l.revoked = append(l.revoked, ls...)
	l.mu.Unlock()
}
func (l *lanesLog) Lost(ls []string) { l.mu.Lock(); l.lost = append(l.lost, ls...); l.mu.Unlock() }

func (l *lanesLog) has(which *[]string, lane string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(*which, lane)
}

// TestFence takes a member's lease away behind its back, as a lease that
// ran out on the server while the member was frozen and was taken by
// another: the member can neither acknowledge what it read under the old
// claim nor read anything more of the lane; it reports the lane lost,
// and what it read stays pending for the lease's new holder, who claims
// it first and in order.
func TestFence(t *testing.T) {
	ctx := context.Background()
	c, topic := openTestConn(t, "partitions=1&lease_ttl=30s&rebalance_interval=50ms", "redisbus-fence-")
	var msgs []*driver.Message
	for i := range 10 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("m%d", i), Body: []byte("x")})
	}
	if err := c.Publish(ctx, topic, msgs, driver.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	lanes := &lanesLog{}
	ds0, err := c.Subscribe(ctx, topic, driver.SubscribeOptions{Group: "g", StartAt: driver.StartEarliest, MaxInFlight: 4, Lanes: lanes})
	if err != nil {
		t.Fatal(err)
	}
	a := ds0.(*sub)
	defer a.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !lanes.has(&lanes.claimed, "0") {
		if time.Now().After(deadline) {
			t.Fatal("lane 0 never claimed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	got, err := a.Receive(rctx, driver.Room{Count: 4, Bytes: 1 << 20})
	cancel()
	if err != nil || len(got) == 0 {
		t.Fatalf("Receive: %d deliveries, %v", len(got), err)
	}
	// The lease runs out and another member takes it.
	stream := streamKey(topic, 0)
	key := leaseKey(stream, "g")
	if err := c.rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	intruder, err := acquireScript.Run(ctx, c.rdb, []string{key, fenceKey(topic, "g")}, "intruder", 30000).Text()
	if err != nil {
		t.Fatal(err)
	}
	// The Ack fails, or finds the lane gone already (the reader, a read
	// ahead, may have met the fence first); either way nothing is
	// acknowledged.
	t.Logf("Ack under the old claim: %v", a.Ack(ctx, got))
	// Pending: what it delivered, and the read it made ahead.
	pending, _ := c.rdb.XPending(ctx, stream, "g").Result()
	if pending.Count < int64(len(got)) {
		t.Fatalf("pending %d, want at least the %d delivered under the old claim", pending.Count, len(got))
	}
	deadline = time.Now().Add(10 * time.Second)
	for !lanes.has(&lanes.lost, "0") {
		if time.Now().After(deadline) {
			t.Fatal("lane 0 was never reported lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Nothing more of the lane: the reads are fenced.
	rctx, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
	more, err := a.Receive(rctx, driver.Room{Count: 4, Bytes: 1 << 20})
	cancel()
	if len(more) > 0 {
		t.Fatalf("Receive after the lease was taken returned %d deliveries (%v)", len(more), err)
	}
	// The new holder claims what the old one read, first and in order,
	// its delivery count going on.
	l := &lane{id: "0", stream: stream, lease: key, token: intruder}
	b := &sub{c: c, group: "g", consumer: "intruder", ctx: ctx, rd: c.rdb}
	claimed, _, ok, err := b.claim(l, "0-0", 100, 0, true)
	if err != nil || !ok {
		t.Fatalf("the new holder's claim: ok %v, %v", ok, err)
	}
	if int64(len(claimed)) != pending.Count {
		t.Fatalf("the new holder claimed %d, want the %d pending", len(claimed), pending.Count)
	}
	for i, d := range claimed {
		if d.ID != fmt.Sprintf("m%d", i) || d.Attempt != 2 {
			t.Errorf("claimed %d: %s attempt %d, want m%d attempt 2", i, d.ID, d.Attempt, i)
		}
	}
}

package redisbus_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/redisbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestCloseHandsBackAll: a member that closes holding entries hands
// every one of them back (their idle time set to claim_idle, so any
// member's next claim takes them), not only the first of each batch.
func TestCloseHandsBackAll(t *testing.T) {
	u := serverURL(t)
	c := transporttest.Open(t, u)
	topic := topicName(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got atomic.Int64
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, _ *omnibus.Message) error {
		got.Add(1)
		<-ctx.Done() // held until the consumer closes
		return ctx.Err()
	}, omnibus.Group("g"), omnibus.Order(omnibus.OrderNone), omnibus.MaxInFlight(100))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	const n = 20
	msgs := make([]*omnibus.Message, n)
	for i := range msgs {
		msgs[i] = &omnibus.Message{Body: []byte("x")}
	}
	if err := c.Publish(ctx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	for got.Load() < n {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d received", got.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	pending, err := raw(t, u).XPendingExt(ctx, &redis.XPendingExtArgs{Stream: topic, Group: "g", Start: "-", End: "+", Count: 100}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != n {
		t.Fatalf("%d pending, want %d", len(pending), n)
	}
	for _, p := range pending {
		if p.Idle < redisbus.DefaultClaimIdle {
			t.Errorf("entry %s idle %v after Close, want at least claim_idle %v (handed back)", p.ID, p.Idle, redisbus.DefaultClaimIdle)
		}
	}
}

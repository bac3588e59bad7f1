package redisbus_test

import (
	"context"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// TestLagOfGroupJoinedAtEnd: a group that joined at the end of a stream
// and left has a known lag of what was published after, with the age of
// the oldest of it, on both modes (Redis counts such a group's lag only
// when told, at its creation, how many entries the stream had).
func TestLagOfGroupJoinedAtEnd(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "claim_idle=1s", "partitioned": partitionedParams} {
		t.Run(name, func(t *testing.T) {
			u := with(serverURL(t), params)
			ctx := context.Background()
			c, err := omnibus.Open(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			topic := topicName(t, u)
			publish := func(n int) {
				for range n {
					if err := c.Publish(ctx, topic, &omnibus.Message{Key: "k", Body: []byte("x")}); err != nil {
						t.Fatal(err)
					}
				}
			}
			publish(5)
			k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("left"))
			if err != nil {
				t.Fatal(err)
			}
			go k.Run(ctx)
			time.Sleep(200 * time.Millisecond)
			if err := k.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			publish(7)
			time.Sleep(300 * time.Millisecond)
			lags, err := c.Lag(ctx, topic, "left")
			elapsed := time.Since(before)
			if err != nil {
				t.Fatal(err)
			}
			total := int64(0)
			for _, l := range lags {
				if !l.Known || !l.AgeKnown {
					t.Errorf("lane %s: %+v, want a known lag and age", l.Lane, l)
					continue
				}
				total += l.Lag
				switch {
				case l.Lag > 0 && (l.Age < 200*time.Millisecond || l.Age > elapsed+250*time.Millisecond):
					t.Errorf("lane %s: age %v, want %v..%v", l.Lane, l.Age, 200*time.Millisecond, elapsed)
				case l.Lag == 0 && l.Age != 0:
					t.Errorf("lane %s: no lag, age %v, want 0", l.Lane, l.Age)
				}
			}
			if total != 7 {
				t.Errorf("lag %d, want the 7 published after the group left: %+v", total, lags)
			}
		})
	}
}

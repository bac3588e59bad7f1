package natsbus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestAgeFollowsAckFloor: a lane's age is the stream's time of the first
// message after the consumer's ack floor. Two messages published a
// measured second apart: while the first is held, the age is the first's;
// once it is acknowledged, the second's; then a known 0. The server keeps
// its own times, so the test waits instead of faking a clock. Read from
// outside the group (as omnibus lag and the autoscaler do), on an
// unpartitioned and a partitioned topic.
func TestAgeFollowsAckFloor(t *testing.T) {
	for _, params := range []string{"", "partitions=2&lease_ttl=2s&rebalance_interval=100ms"} {
		t.Run("partitions="+fmt.Sprint(params != ""), func(t *testing.T) {
			u := externalURL(t) + "?" + params
			order := omnibus.OrderLane
			if params == "" {
				order = omnibus.OrderNone // one unordered lane; one message in flight
			}
			c := transporttest.Open(t, u)
			topic := topicName(t, u)
			gate := make(chan struct{}, 2)
			k, err := c.Subscribe(ctxT(t), topic, func(ctx context.Context, m *omnibus.Message) error {
				select {
				case <-gate:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, omnibus.Group("aged"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(order), omnibus.MaxInFlight(1))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { close(gate) })
			transporttest.RunConsumer(t, k)

			var published [2][2]time.Time // before and after each publish
			for i := range published {
				if i > 0 {
					time.Sleep(time.Second) // the first message ages
				}
				published[i][0] = time.Now()
				if err := c.Publish(ctxT(t), topic, &omnibus.Message{Key: "k", Body: []byte("x")}); err != nil {
					t.Fatal(err)
				}
				published[i][1] = time.Now()
			}
			// age reads the group's lag until the lane of the key shows
			// lag lag, and checks its age against message i's publish.
			age := func(lag int64, i int) {
				t.Helper()
				var got omnibus.LaneLag
				var read0, read1 time.Time
				eventually(t, 30*time.Second, func() error {
					read0 = time.Now()
					lags, err := c.Lag(ctxT(t), topic, "aged")
					read1 = time.Now()
					if err != nil {
						return err
					}
					var sum int64
					for _, l := range lags {
						sum += l.Lag
						if l.Lag > 0 {
							got = l
						}
					}
					if sum != lag {
						return fmt.Errorf("lag %d, want %d: %+v", sum, lag, lags)
					}
					return nil
				})
				const slack = 50 * time.Millisecond
				lo, hi := read0.Sub(published[i][1])-slack, read1.Sub(published[i][0])+slack
				if !got.AgeKnown || got.Age < lo || got.Age > hi {
					t.Errorf("lag %d: age %v (known %v), want %v..%v (message %d's)", lag, got.Age, got.AgeKnown, lo, hi, i)
				}
			}
			age(2, 0)
			gate <- struct{}{}
			age(1, 1)
			gate <- struct{}{}
			eventually(t, 30*time.Second, func() error {
				lags, err := c.Lag(ctxT(t), topic, "aged")
				if err != nil {
					return err
				}
				for _, l := range lags {
					if !l.Known || l.Lag != 0 || !l.AgeKnown || l.Age != 0 {
						return fmt.Errorf("not every lane a known lag and age 0: %+v", lags)
					}
				}
				return nil
			})
		})
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

package rabbitbus

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestAgeWhereTheBrokerTells: a lane's age is that of the oldest
// delivery the client holds, and unknown where AMQP cannot tell. RabbitMQ
// keeps the publisher's time, so the backlog's age is set when
// publishing: messages one hour, 30 minutes and 1 minute old. Client a
// consumes; client b, another process, reads the group from outside.
func TestAgeWhereTheBrokerTells(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := open(ctx, t, ""), open(ctx, t, "")
	topic := "age-" + omnibus.NewID()[12:]
	gate := make(chan struct{}, 3)
	hold := func(ctx context.Context, m *omnibus.Message) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	k, err := a.Subscribe(ctx, topic, hold, omnibus.Group("aged"), omnibus.MaxInFlight(1))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	now := time.Now()
	olds := []time.Duration{time.Hour, 30 * time.Minute, time.Minute}
	for _, old := range olds {
		if err := a.Publish(ctx, topic, &omnibus.Message{Time: now.Add(-old), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	lane := func(read func(context.Context) ([]omnibus.LaneLag, error), lag int64) omnibus.LaneLag {
		t.Helper()
		var got []omnibus.LaneLag
		transporttest.Eventually(t, 30*time.Second, func() bool {
			var err error
			got, err = read(ctx)
			return err == nil && len(got) == 1 && got[0].Known && got[0].Lag == lag
		}, func() string { return fmt.Sprintf("lag %+v, want one lane with lag %d", got, lag) })
		return got[0]
	}
	inside := k.Lag
	outside := func(ctx context.Context) ([]omnibus.LaneLag, error) { return b.Lag(ctx, topic, "aged") }
	near := func(l omnibus.LaneLag, old time.Duration) bool {
		return l.AgeKnown && l.Age >= old-time.Second && l.Age <= old+time.Since(now)+time.Second
	}

	// a holds the oldest message: a knows its age; b does not (a
	// consumer of another process may hold older ones).
	if l := lane(inside, 3); !near(l, olds[0]) {
		t.Errorf("holding the 1h-old message: age %v (known %v), want about 1h", l.Age, l.AgeKnown)
	}
	if l := lane(outside, 2); l.AgeKnown {
		t.Errorf("from another process, with a consumer holding messages: age %v known, want unknown", l.Age)
	}
	gate <- struct{}{}
	transporttest.Eventually(t, 30*time.Second, func() bool { return near(lane(inside, 2), olds[1]) },
		func() string { return "holding the 30m-old message: age never about 30m" })

	// Nobody consumes: the head of the queue is out of sight.
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if l := lane(outside, 2); l.AgeKnown {
		t.Errorf("2 ready, no consumer: age %v known, want unknown (AMQP shows no queue's head)", l.Age)
	}

	// Consumed to the end: a known 0 for the consumer, unknown for
	// another process while the consumer is there, a known 0 once it left.
	close(gate)
	k2, err := a.Subscribe(ctx, topic, hold, omnibus.Group("aged"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k2)
	// The queue shows no message ready once the last is delivered; the
	// age is a known 0 once it is also settled.
	var l omnibus.LaneLag
	transporttest.Eventually(t, 30*time.Second, func() bool { l = lane(k2.Lag, 0); return l.AgeKnown && l.Age == 0 },
		func() string { return fmt.Sprintf("all handled: age %v (known %v), want a known 0", l.Age, l.AgeKnown) })
	if l := lane(outside, 0); l.AgeKnown {
		t.Errorf("from another process while a consumer is there: age %v known, want unknown", l.Age)
	}
	if err := k2.Close(); err != nil {
		t.Fatal(err)
	}
	transporttest.Eventually(t, 30*time.Second, func() bool { l := lane(outside, 0); return l.AgeKnown && l.Age == 0 },
		func() string { return "queue empty and no consumer: age never a known 0" })
}

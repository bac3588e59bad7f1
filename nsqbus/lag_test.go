package nsqbus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestAgeUnknownWhereUncertain: a channel's age is known to the client
// whose member holds the channel's oldest message, and unknown (never 0)
// to another client, which holds none, and once a message was requeued
// behind newer ones; with nothing left it is a known 0.
func TestAgeUnknownWhereUncertain(t *testing.T) {
	u := directURL(t)
	member, outside := transporttest.Open(t, u), transporttest.Open(t, u)
	topic := fmt.Sprintf("age-%d", time.Now().UnixNano())
	t.Cleanup(func() { deleteTopic(t, topic) })
	ctx := context.Background()

	release := make(chan struct{})
	fail := make(chan struct{}, 1)
	got := make(chan struct{}, 1)
	k, err := member.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		select {
		case got <- struct{}{}:
		default:
		}
		select {
		case <-fail:
			return errors.New("fails once")
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, omnibus.Group("g"), omnibus.MaxInFlight(1), omnibus.MaxAttempts(10), omnibus.Backoff(2*time.Second, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	if err := member.Publish(ctx, topic, numbered("m", 0, 3, 16)...); err != nil {
		t.Fatal(err)
	}
	<-got
	lag := func(c *omnibus.Client) omnibus.LaneLag {
		t.Helper()
		lags, err := c.Lag(ctx, topic, "g")
		if err != nil || len(lags) != 1 {
			t.Fatalf("Lag: %v, %v", lags, err)
		}
		return lags[0]
	}
	transporttest.Eventually(t, 10*time.Second, func() bool {
		l := lag(member)
		return l.Known && l.Lag == 3 && l.AgeKnown && l.Age > 0
	}, func() string { return fmt.Sprintf("the member's client: %+v, want lag 3 and a known age", lag(member)) })
	if l := lag(outside); !l.Known || l.Lag != 3 || l.AgeKnown {
		t.Errorf("another client: %+v, want lag 3 and an unknown age (it holds nothing)", l)
	}

	fail <- struct{}{} // a REQ with a delay: deferred, then behind newer ones
	transporttest.Eventually(t, 10*time.Second, func() bool {
		l := lag(member)
		return l.Known && l.Lag == 3 && !l.AgeKnown
	}, func() string { return fmt.Sprintf("after a requeue: %+v, want lag 3 and an unknown age", lag(member)) })

	close(release)
	transporttest.Eventually(t, 30*time.Second, func() bool {
		l := lag(outside)
		return l.Known && l.Lag == 0 && l.AgeKnown && l.Age == 0
	}, func() string {
		return fmt.Sprintf("every message handled: %+v, want lag 0 and a known age 0", lag(outside))
	})
}

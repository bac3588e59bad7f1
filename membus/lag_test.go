package membus_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/membus"
)

// fakeClock is a membus.Config.Clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestAgeOnFakeClock: a lane's age is exactly the clock's time since the
// record at the committed offset was appended, whatever the messages' own
// times say, and a known 0 once the group has committed everything.
func TestAgeOnFakeClock(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 2, Clock: clock.Now}).Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const topic = "aged"
	if err := c.CreateTopic(ctx, topic, 2); err != nil {
		t.Fatal(err)
	}
	key := "k" // partition of "k": every message below goes there
	lane := membus.Partition(key, 2)
	var handled []string
	var mu sync.Mutex
	gate := make(chan struct{}, 16)
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		mu.Lock()
		handled = append(handled, m.ID)
		mu.Unlock()
		return nil
	}, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(omnibus.OrderLane), omnibus.CommitInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(runCtx) }()
	defer func() { close(gate); cancel(); <-done }()

	// Three records, appended 90s, 60s and 10s before the read; the
	// first one claims a time a day earlier, which must not matter.
	publish := func(at time.Time) {
		t.Helper()
		if err := c.Publish(ctx, topic, &omnibus.Message{Key: key, Time: at.Add(-24 * time.Hour), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	publish(clock.Now())
	clock.Add(30 * time.Second)
	publish(clock.Now())
	clock.Add(50 * time.Second)
	publish(clock.Now())
	clock.Add(10 * time.Second)

	ageOf := func() (omnibus.LaneLag, omnibus.LaneLag) {
		t.Helper()
		lags, err := k.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(lags) != 2 {
			t.Fatalf("Lag: %d lanes, want 2: %+v", len(lags), lags)
		}
		return lags[lane], lags[1-lane]
	}
	l, other := ageOf()
	if l.Lag != 3 || !l.AgeKnown || l.Age != 90*time.Second {
		t.Errorf("lane %s: lag %d age %v (known %v), want lag 3 age 1m30s", l.Lane, l.Lag, l.Age, l.AgeKnown)
	}
	if other.Lag != 0 || !other.AgeKnown || other.Age != 0 {
		t.Errorf("empty lane %s: lag %d age %v (known %v), want a known 0", other.Lane, other.Lag, other.Age, other.AgeKnown)
	}

	// One handled and committed: the oldest unsettled is the second,
	// appended 60s before.
	gate <- struct{}{}
	waitFor(t, func() bool { l, _ := ageOf(); return l.Lag == 2 })
	if l, _ := ageOf(); !l.AgeKnown || l.Age != 60*time.Second || l.Committed != 1 {
		t.Errorf("after one commit: age %v (known %v) committed %d, want 1m0s at offset 1", l.Age, l.AgeKnown, l.Committed)
	}
	clock.Add(5 * time.Second)
	if l, _ := ageOf(); l.Age != 65*time.Second {
		t.Errorf("5s later: age %v, want 1m5s", l.Age)
	}

	gate <- struct{}{}
	gate <- struct{}{}
	waitFor(t, func() bool { l, _ := ageOf(); return l.Lag == 0 })
	if l, _ := ageOf(); !l.AgeKnown || l.Age != 0 {
		t.Errorf("all committed: age %v (known %v), want a known 0", l.Age, l.AgeKnown)
	}

	// The same from outside the group.
	lags, err := c.Lag(ctx, topic, "g")
	if err != nil || len(lags) != 2 || !lags[lane].AgeKnown || lags[lane].Age != 0 || lags[lane].Committed != 3 {
		t.Errorf("Client.Lag: %+v, %v; want lane %d at offset 3 with a known age 0", lags, err, lane)
	}
	if n, err := c.Members(ctx, topic, "g"); n != 1 || err != nil {
		t.Errorf("Members: %d, %v; want 1", n, err)
	}
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met within 10s")
		}
	}
}

package rabbitbus

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/transporttest"
)

// slowLanes is a driver.Lanes whose Revoked takes as long as the test
// says, as an engine draining a slow handler does.
type slowLanes struct {
	mu       sync.Mutex
	claimed  map[string]bool
	revoking chan string   // a lane whose revocation started
	release  chan struct{} // closed: Revoked returns
	lost     chan string   // a lane lost
}

func (l *slowLanes) Claimed(ids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.claimed[id] = true
	}
}

func (l *slowLanes) Revoked(ctx context.Context, ids []string) {
	for _, id := range ids {
		select {
		case l.revoking <- id:
		default:
		}
	}
	select {
	case <-l.release:
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		delete(l.claimed, id)
	}
}

func (l *slowLanes) Lost(ids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		delete(l.claimed, id)
		select {
		case l.lost <- id:
		default:
		}
	}
}

func (l *slowLanes) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.claimed)
}

// receipt is what one Receive returned.
type receipt struct {
	at    time.Time
	lanes []string
}

// A member hands a lane over while it keeps the others. The revocation
// takes a while (the engine drains the lane); meanwhile the lanes that
// stay must go on delivering, the Receive in progress when the revocation
// starts must return once, promptly, Receive must not return empty over
// and over, and a lane lost meanwhile (its queue deleted) must reach the
// engine at once, not after the revocation.
func TestRevocationKeepsOtherLanesFlowing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const params = "partitions=4&rebalance=200ms"
	c := open(ctx, t, params)
	topic := "omnibus-revoke-" + strings.ToLower(omnibus.NewID())
	lanes := &slowLanes{claimed: map[string]bool{}, revoking: make(chan string, 8), release: make(chan struct{}), lost: make(chan string, 8)}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(lanes.release) }) }
	t.Cleanup(release)
	sub, err := c.Driver().(*conn).Subscribe(ctx, topic, driver.SubscribeOptions{
		Group: "g", MaxInFlight: 64, MaxInFlightBytes: 1 << 20, Lanes: lanes,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { release(); _ = sub.Close() })

	var mu sync.Mutex
	var got []receipt
	rctx, rcancel := context.WithCancel(ctx)
	received := make(chan struct{})
	go func() {
		defer close(received)
		for {
			ds, err := sub.Receive(rctx, driver.Room{Count: 64, Bytes: 1 << 20, Oversize: true})
			if err != nil {
				return
			}
			r := receipt{at: time.Now()}
			for _, d := range ds {
				r.lanes = append(r.lanes, d.Lane)
			}
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
			_ = sub.(driver.Acker).Ack(rctx, ds)
		}
	}()
	t.Cleanup(func() { rcancel(); <-received })

	publish := func(n int) {
		ms := make([]*omnibus.Message, n)
		for i := range ms {
			ms[i] = &omnibus.Message{Key: "k" + strconv.Itoa(i%64), Body: []byte("x")}
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	// The member claims a lane at its first delivery: send until it holds all four.
	transporttest.Eventually(t, 30*time.Second, func() bool { publish(64); return lanes.count() == 4 }, func() string {
		return fmt.Sprintf("the member claimed %d of 4 lanes", lanes.count())
	})
	// Let it go idle: its Receive waits.
	idle := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && time.Since(got[len(got)-1].at) > 300*time.Millisecond
	}
	transporttest.Eventually(t, 30*time.Second, idle, func() string { return "the member never went idle" })
	mu.Lock()
	before := len(got)
	mu.Unlock()

	// A second member joins: the first hands lanes over, one at a time.
	other := open(ctx, t, params)
	k, err := other.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	var revoked string
	select {
	case revoked = <-lanes.revoking:
	case <-time.After(30 * time.Second):
		t.Fatal("no lane was revoked within 30s of a second member joining")
	}
	start := time.Now()
	// The Receive that was waiting returned when the revocation started.
	transporttest.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > before
	}, func() string { return "the Receive in progress did not return when the revocation started" })

	// While the revocation takes its time, the other lanes deliver.
	var sent atomic.Int64
	const window = 3 * time.Second
	for time.Since(start) < window {
		publish(32)
		sent.Add(32)
		time.Sleep(100 * time.Millisecond)
	}
	// A lane that stays is lost while the revocation still runs.
	lose := "0"
	if revoked == lose {
		lose = "1"
	}
	n, _ := strconv.Atoi(lose)
	ac, ch := rawChannel(t)
	defer ac.Close()
	if _, err := ch.QueueDelete(partitionQueue(topic, "g", n), false, false, false); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-lanes.lost:
		if id != lose {
			t.Errorf("lost lane %s, want %s", id, lose)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("lane %s, whose queue was deleted, was not reported lost within 5s while lane %s's revocation ran", lose, revoked)
	}
	release()
	mu.Lock()
	defer mu.Unlock()
	stay, empty := 0, 0
	for _, r := range got[before:] {
		if r.at.After(start.Add(window)) {
			break
		}
		if len(r.lanes) == 0 {
			empty++
		}
		for _, l := range r.lanes {
			if l == revoked {
				t.Errorf("Receive returned a delivery of lane %s while it was being revoked", l)
			}
			stay++
		}
	}
	t.Logf("during the %v revocation of lane %s: %d deliveries of the other lanes (%d sent to all four), %d empty Receives", window, revoked, stay, sent.Load(), empty)
	if stay == 0 {
		t.Errorf("the lanes that stay delivered nothing during the %v revocation of lane %s", window, revoked)
	}
	if empty > 3 {
		t.Errorf("Receive returned empty %d times during one revocation; want once when it starts (and once when it ends)", empty)
	}
}

// The same through the engine: a member hands lane 3 over while a slow
// handler holds it, so the revocation drains for seconds; the lanes the
// member keeps go on being handled meanwhile.
func TestRevocationDrainKeepsOtherLanesHandled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const params = "partitions=4&rebalance=200ms"
	const slowFor = 5 * time.Second
	c := open(ctx, t, params)
	topic := "omnibus-revokedrain-" + strings.ToLower(omnibus.NewID())
	var mu sync.Mutex
	keyLane := map[string]string{}
	var kept []time.Time // when messages of lanes 0 and 1 were handled
	var slowStart, slowEnd time.Time
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		keyLane[m.Key] = m.Lane
		if m.Lane == "0" || m.Lane == "1" {
			kept = append(kept, time.Now())
		}
		slow := m.Headers["slow"] == "1"
		if slow {
			slowStart = time.Now()
		}
		mu.Unlock()
		if !slow {
			return nil
		}
		select {
		case <-time.After(slowFor):
		case <-ctx.Done():
		}
		mu.Lock()
		slowEnd = time.Now()
		mu.Unlock()
		return nil
	}, omnibus.Group("g"), omnibus.Order(omnibus.OrderKey), omnibus.DrainTimeout(4*slowFor))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	publish := func(keys []string, headers map[string]string) {
		ms := make([]*omnibus.Message, len(keys))
		for i, key := range keys {
			ms[i] = &omnibus.Message{Key: key, Headers: headers, Body: []byte("x")}
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	var keys []string
	for i := range 64 {
		keys = append(keys, "k"+strconv.Itoa(i))
	}
	// Learn which lane each key lands on; the member claims all four.
	transporttest.Eventually(t, 30*time.Second, func() bool {
		publish(keys, nil)
		mu.Lock()
		defer mu.Unlock()
		return len(keyLane) == len(keys)
	}, func() string { return "not every key handled" })
	mu.Lock()
	var onLane3, stay []string
	for key, l := range keyLane {
		switch l {
		case "3":
			onLane3 = append(onLane3, key)
		case "0", "1":
			stay = append(stay, key)
		}
	}
	mu.Unlock()
	if len(onLane3) == 0 || len(stay) == 0 {
		t.Fatalf("keys by lane %v: want some on lane 3 and some on lanes 0 and 1", keyLane)
	}
	publish(onLane3[:1], map[string]string{"slow": "1"})
	transporttest.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return !slowStart.IsZero() }, func() string { return "the slow message was not handled" })

	// A second member joins: the first hands lanes 3 and 2 over, lane 3
	// first, and its revocation waits for the slow handler.
	other := open(ctx, t, params)
	k2, err := other.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k2)
	joined := time.Now()
	for {
		mu.Lock()
		done := !slowEnd.IsZero()
		mu.Unlock()
		if done || time.Since(joined) > 2*slowFor {
			break
		}
		publish(stay, nil)
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	// From a second after the join (the rebalance interval is 200ms) to
	// the end of the drain.
	from, n := joined.Add(time.Second), 0
	for _, at := range kept {
		if at.After(from) && at.Before(slowEnd) {
			n++
		}
	}
	t.Logf("lanes 0 and 1: %d messages handled while lane 3 drained (%v)", n, slowEnd.Sub(from))
	if n == 0 {
		t.Errorf("the lanes the member keeps handled nothing during the %v lane 3 drained", slowEnd.Sub(from))
	}
}

package autoscale_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/membus"
)

// clock is a membus clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestTargetAge: on a clock of the test's, a backlog whose oldest message
// is 40 s old, with a target age of 10 s, asks one member for 4; the age
// alone decides (no TargetLag). An age still over the target but falling
// (the group catches up) asks for no more, and one under the target lets
// the group shrink. The handler takes a message once the test releases
// its batch.
func TestTargetAge(t *testing.T) {
	clk := &clock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 8, Clock: clk.Now}).Conn(), omnibus.WithLogger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	batches := map[string]chan struct{}{"w": make(chan struct{}), "a": make(chan struct{}), "b": make(chan struct{}), "c": make(chan struct{})}
	k, err := c.Subscribe(ctx, "aged", func(ctx context.Context, m *omnibus.Message) error {
		select {
		case <-batches[m.Headers["batch"]]:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.CommitInterval(time.Millisecond), omnibus.Order(omnibus.OrderLane),
		omnibus.DrainTimeout(50*time.Millisecond)) // scaling revokes lanes whose messages wait for the test
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = k.Run(ctx) }()
	t.Cleanup(func() {
		for _, ch := range batches {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
		cancel()
		<-done
	})
	total := 0
	publish := func(batch string, n int) {
		t.Helper()
		var ms []*omnibus.Message
		for i := range n {
			ms = append(ms, &omnibus.Message{Key: batch + strconv.Itoa(i), Headers: map[string]string{"batch": batch}, Body: []byte("x")})
		}
		if err := c.Publish(ctx, "aged", ms...); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	handled := 0
	release := func(batch string, n int) {
		t.Helper()
		close(batches[batch])
		handled += n
		waitFor(t, 10*time.Second, func() bool {
			lags, err := k.Lag(ctx)
			if err != nil {
				return false
			}
			var lag int64
			for _, l := range lags {
				lag += l.Lag
			}
			return lag == int64(total-handled)
		}, "batch "+batch+" committed")
	}
	ctl, err := autoscale.New(k, autoscale.Policy{TargetAge: 10 * time.Second, UpCooldown: time.Nanosecond, DownDelay: time.Nanosecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	step := func() autoscale.Decision {
		t.Helper()
		if err := ctl.Step(ctx); err != nil {
			t.Fatal(err)
		}
		d, _, _ := ctl.Watch()
		return d
	}

	publish("w", 80)
	publish("a", 400) // at 0s
	clk.Add(25 * time.Second)
	publish("b", 400) // at 25s
	clk.Add(15 * time.Second)
	step() // no progress seen yet
	release("w", 80)
	d := step()
	if d.Action != "up" || d.Desired != 4 || d.Age != 40*time.Second {
		t.Fatalf("oldest 40s old, target 10s, 1 member: %s to %d (age %v: %s), want up to 4", d.Action, d.Desired, d.Age, d.Reason)
	}
	waitFor(t, 10*time.Second, func() bool { return k.Members() == 4 }, "4 members")

	// The first backlog worked off: the oldest is now 15 s old, over the
	// target with 4 members (6 would bring it under) but falling.
	release("a", 400)
	d = step()
	if d.Age != 15*time.Second || d.Action != "hold" || d.Desired != 4 {
		t.Errorf("oldest now 15s old (was 40s): %s to %d (age %v: %s), want to hold 4", d.Action, d.Desired, d.Age, d.Reason)
	}

	// Both worked off; messages 3 s old behind them: under the target.
	publish("c", 40) // at 40s
	clk.Add(3 * time.Second)
	release("b", 400)
	step() // the first sample asking for fewer starts DownDelay
	// Scaling down drains the leaving member, whose message of "c" waits
	// for the test: bound it; the decision is what is checked.
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	_ = ctl.Step(short)
	d, _, _ = ctl.Watch()
	if d.Age != 3*time.Second || d.Action != "down" || d.Desired != 2 {
		t.Errorf("oldest 3s old, target 10s, 4 members: %s to %d (age %v: %s), want down to 2", d.Action, d.Desired, d.Age, d.Reason)
	}
}

// noAges is a target on a transport that reports no ages.
type noAges struct{ *omnibus.Consumer }

func (noAges) Capabilities() omnibus.Capabilities {
	return omnibus.Capabilities{Lag: driver.LagRecords, ExclusiveLanes: true}
}

func TestTargetAgeNeedsAges(t *testing.T) {
	c, err := omnibus.New(membus.New(membus.Config{}).Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(context.Background(), "t", func(context.Context, *omnibus.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if _, err := autoscale.New(noAges{k}, autoscale.Policy{TargetAge: time.Second}); !errors.Is(err, omnibus.ErrUnsupported) {
		t.Errorf("TargetAge on a transport without ages: %v, want ErrUnsupported", err)
	}
	if _, err := autoscale.New(noAges{k}, autoscale.Policy{TargetLag: 10}); err != nil {
		t.Errorf("TargetLag on the same: %v", err)
	}
}

// TestTwoConsumersShareTheNeed: two consumers of one group (in one test
// process, on one bus: the group's view is the transport's, so they are
// two processes to each other) each take their share of what the group
// needs, stepping at the same moments, and neither calls the other's
// lanes stalled: the group ends at the size its lag asks for (about
// 13,000 messages behind at 2,800 per member: 5), not at the sum of both
// asking for all of it.
func TestTwoConsumersShareTheNeed(t *testing.T) {
	bus := membus.New(membus.Config{Partitions: 12})
	c, err := omnibus.New(bus.Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	publishBacklog(t, c, "shared", 14_000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ks []*omnibus.Consumer
	var ctls []*autoscale.Controller
	for range 2 {
		c, err := omnibus.New(bus.Conn(), omnibus.WithLogger(quiet()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// 10 messages a second per lane, whoever holds it: the need
		// stays 5 for 20 s.
		k, err := c.Subscribe(ctx, "shared", func(ctx context.Context, m *omnibus.Message) error {
			time.Sleep(100 * time.Millisecond)
			return nil
		}, omnibus.Group("g"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(omnibus.OrderLane), omnibus.CommitInterval(10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		go k.Run(ctx)
		ks = append(ks, k)
		ctl, err := autoscale.New(k, autoscale.Policy{TargetLag: 2800, UpCooldown: time.Nanosecond, DownDelay: time.Hour, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		ctls = append(ctls, ctl)
	}
	var last [2]autoscale.Decision
	var mu sync.Mutex
	peak := 0 // the largest need either saw: the group never shrinks here (DownDelay)
	for range 8 {
		time.Sleep(100 * time.Millisecond)
		var wg sync.WaitGroup
		for i, ctl := range ctls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = ctl.Step(ctx)
				last[i], _, _ = ctl.Watch()
				mu.Lock()
				peak = max(peak, last[i].GroupDesired)
				mu.Unlock()
				if len(last[i].Stalled) > 0 {
					t.Errorf("consumer %d calls lanes %v stalled: %s", i, last[i].Stalled, last[i].Reason)
				}
			}()
		}
		wg.Wait()
	}
	a, b := ks[0].Members(), ks[1].Members()
	for i, d := range last {
		t.Logf("consumer %d: %d members, group %d, need %d: %s", i, ks[i].Members(), d.Members, d.GroupDesired, d.Reason)
	}
	if need := min(last[0].GroupDesired, last[1].GroupDesired); a+b < need || a+b > peak || peak < 3 {
		t.Errorf("the group ended at %d members (%d + %d); the consumers' last needs %d and %d, the largest %d: want the need (it may have fallen since the group grew)",
			a+b, a, b, last[0].GroupDesired, last[1].GroupDesired, peak)
	}
}

// publishBacklog publishes n messages with keys spread over the lanes.
func publishBacklog(t *testing.T, c *omnibus.Client, topic string, n int) {
	t.Helper()
	var ms []*omnibus.Message
	for i := range n {
		ms = append(ms, &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte("x")})
	}
	if err := c.Publish(context.Background(), topic, ms...); err != nil {
		t.Fatal(err)
	}
}

// hookRecorder is a DecisionHook.
type hookRecorder struct{ recorder }

func (h *hookRecorder) OnDecision(d autoscale.Decision) { h.add(d) }

// TestDecisionHook: a hook in Policy.Hooks sees every decision, named by
// the consumer's topic and group; a hook of another kind is ignored.
func TestDecisionHook(t *testing.T) {
	c, err := omnibus.New(membus.New(membus.Config{}).Conn())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(context.Background(), "orders", func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	h := &hookRecorder{}
	ctl, err := autoscale.New(k, autoscale.Policy{TargetLag: 10, Logger: quiet(), Hooks: []omnibus.Hook{"not a hook", h}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := ctl.Step(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ds) != 3 || h.ds[0].Topic != "orders" || h.ds[0].Group != "billing" || h.ds[0].Members != 1 {
		t.Errorf("hook saw %+v, want 3 decisions on orders/billing with 1 member", h.ds)
	}
}

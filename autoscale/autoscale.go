// Package autoscale sizes a consumer group from its lag.
//
// A Controller samples a consumer's lag and per-lane progress at a fixed
// interval and sets the number of group members running in the process
// (omnibus.Consumer.Scale): more when the lag per member is above the
// target, fewer when it has stayed below for a while.
//
//	k, _ := c.Subscribe(ctx, "orders", handle, omnibus.Group("billing"))
//	ctl, _ := autoscale.New(k, autoscale.Policy{TargetLag: 1000, Max: 12})
//	go ctl.Run(ctx)
//	k.Run(ctx)
//
// The lag is what the transport reports: records on Kafka and membus,
// messages pending on brokers; TargetLag is in the same unit.
//
// # Policy
//
//   - Never more members than lanes where the transport caps parallelism
//     (a partition is read by one member); a log line says when the cap,
//     not the target, limits the size.
//   - Up quickly, in one step to the size the lag asks for; down slowly,
//     after the lag has asked for fewer for DownDelay, to the largest size
//     asked for during that time. Each change causes a rebalance, so fewer,
//     larger steps are preferred.
//   - A lane's lag asks for more members once the lane is seen to
//     progress between samples. A lane with lag that has not progressed
//     for StallAfter samples is stalled (a poison message, a dead
//     dependency): more members would not help, so its lag does not ask
//     for more. It still keeps the group from shrinking: a lane that is
//     changing hands looks stalled for a moment too.
//   - A lag read that fails, or a lane whose lag is unknown, holds the
//     current size: unknown is never read as zero.
//
// Scaling down is graceful: the leaving member's lanes are drained and
// committed before they move.
//
// Every decision is logged with its inputs and passed to
// Policy.OnDecision, so metrics can export the lag, the member count and
// the decisions, and an external autoscaler can use the same signal.
package autoscale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Target is what a Controller sizes. *omnibus.Consumer implements it.
type Target interface {
	Members() int
	Scale(ctx context.Context, n int) error
	Lag(ctx context.Context) ([]omnibus.LaneLag, error)
	Stats() omnibus.Stats
	Capabilities() omnibus.Capabilities
}

// Policy configures a Controller. Only TargetLag is required.
type Policy struct {
	// TargetLag is the lag one member should carry, in the transport's
	// lag unit. The desired size is the lag of lanes that progress divided
	// by TargetLag, rounded up. Required.
	TargetLag int64
	// Min is the fewest members. Default: 1.
	Min int
	// Max is the most members. Default: the lane count where the
	// transport caps parallelism, else 8.
	Max int
	// Interval is how often lag is sampled. Default: 5s.
	Interval time.Duration
	// UpCooldown is the least time between two scale-ups. Default: 15s.
	UpCooldown time.Duration
	// DownDelay is how long the lag must ask for fewer members before the
	// controller scales down. Default: 2m.
	DownDelay time.Duration
	// StallAfter is the number of samples with lag and no progress after
	// which a lane is stalled. Default: 3.
	StallAfter int
	// Logger receives a record per decision. Default: slog.Default().
	Logger *slog.Logger
	// OnDecision, when set, receives every decision.
	OnDecision func(Decision)
}

// Decision is one evaluation of the policy.
type Decision struct {
	Time    time.Time
	Current int
	Desired int
	// Action is "up", "down" or "hold".
	Action string
	Reason string
	// Lag is the total lag of the lanes that progress; Stalled lanes are
	// left out of it.
	Lag     int64
	Cap     int
	Lanes   []LaneSample
	Stalled []string
}

// LaneSample is one lane as the controller saw it.
type LaneSample struct {
	Lane    string
	Lag     int64
	Known   bool
	Settled int64 // messages settled so far on the lane
	Stalled bool
}

// Controller runs the policy against one Target.
type Controller struct {
	t      Target
	p      Policy
	logger *slog.Logger

	// Owned by Run's goroutine.
	history   map[string][]int64 // settled counts of the last samples per lane
	lastUp    time.Time
	downSince time.Time
	downMax   int
}

// New returns a controller for t. It validates the policy and fills its
// defaults.
func New(t Target, p Policy) (*Controller, error) {
	if t == nil {
		return nil, fmt.Errorf("autoscale: nil target: %w", omnibus.ErrInvalid)
	}
	if p.TargetLag <= 0 {
		return nil, fmt.Errorf("autoscale: TargetLag must be positive, got %d: %w", p.TargetLag, omnibus.ErrInvalid)
	}
	if p.Min == 0 {
		p.Min = 1
	}
	for name, v := range map[string]time.Duration{"Interval": p.Interval, "UpCooldown": p.UpCooldown, "DownDelay": p.DownDelay} {
		if v < 0 {
			return nil, fmt.Errorf("autoscale: %s is negative: %w", name, omnibus.ErrInvalid)
		}
	}
	if p.Min < 0 || p.Max < 0 || p.StallAfter < 0 {
		return nil, fmt.Errorf("autoscale: Min, Max and StallAfter must not be negative: %w", omnibus.ErrInvalid)
	}
	if p.Max != 0 && p.Max < p.Min {
		return nil, fmt.Errorf("autoscale: Max %d below Min %d: %w", p.Max, p.Min, omnibus.ErrInvalid)
	}
	if p.Interval == 0 {
		p.Interval = 5 * time.Second
	}
	if p.UpCooldown == 0 {
		p.UpCooldown = 15 * time.Second
	}
	if p.DownDelay == 0 {
		p.DownDelay = 2 * time.Minute
	}
	if p.StallAfter == 0 {
		p.StallAfter = 3
	}
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	return &Controller{t: t, p: p, logger: p.Logger, history: map[string][]int64{}}, nil
}

// Run evaluates the policy every Interval until ctx ends, and returns
// nil then, or when the target is closed.
func (c *Controller) Run(ctx context.Context) error {
	tick := time.NewTicker(c.p.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if err := c.Step(ctx); errors.Is(err, omnibus.ErrClosed) {
			return nil
		}
	}
}

// Step samples the target once, decides, and scales. Run calls it every
// Interval; tests and custom loops may call it directly.
func (c *Controller) Step(ctx context.Context) error {
	now := time.Now()
	d := c.decide(ctx, now)
	var err error
	if d.Action != "hold" {
		if err = c.t.Scale(ctx, d.Desired); err != nil {
			d.Reason += "; scale failed: " + err.Error()
		}
	}
	c.report(d)
	return err
}

func (c *Controller) decide(ctx context.Context, now time.Time) Decision {
	current := c.t.Members()
	d := Decision{Time: now, Current: current, Desired: current, Action: "hold"}
	lags, err := c.t.Lag(ctx)
	if err != nil {
		d.Reason = "lag unknown (" + err.Error() + "): holding"
		return d
	}
	settled := map[string]int64{}
	for _, l := range c.t.Stats().Lanes {
		settled[l.Lane] = l.Settled
	}
	d.Cap = c.p.Max
	if c.t.Capabilities().ExclusiveLanes && (d.Cap == 0 || len(lags) < d.Cap) {
		d.Cap = len(lags)
	}
	if d.Cap == 0 {
		d.Cap = 8
	}
	unknown := false
	var known int64 // lag of every lane, progressing or not
	for _, l := range lags {
		s := LaneSample{Lane: l.Lane, Lag: l.Lag, Known: l.Known, Settled: settled[l.Lane]}
		h := append(c.history[l.Lane], s.Settled)
		if len(h) > c.p.StallAfter+1 {
			h = h[len(h)-c.p.StallAfter-1:]
		}
		c.history[l.Lane] = h
		// A lane's lag counts once the lane is seen to progress: adding
		// members helps only lanes that move.
		progressing := len(h) >= 2 && h[len(h)-1] > h[0]
		if l.Known {
			known += l.Lag
		}
		switch {
		case !l.Known:
			unknown = true
		case l.Lag == 0 || progressing:
			d.Lag += l.Lag
		case len(h) == c.p.StallAfter+1:
			s.Stalled = true
			d.Stalled = append(d.Stalled, l.Lane)
		}
		d.Lanes = append(d.Lanes, s)
	}
	if unknown {
		d.Reason = "lag of some lane unknown: holding"
		return d
	}
	// Up on the lag of lanes that progress; down only as far as all the
	// known lag allows, so a lane that looks stuck (or is changing hands)
	// never shrinks the group.
	want := c.size(d.Lag)
	floor := c.size(known)
	capped := want > d.Cap
	desired := max(min(want, d.Cap), c.p.Min)
	if desired <= current {
		desired = max(min(floor, d.Cap, current), c.p.Min)
	}
	d.Desired = desired
	reason := fmt.Sprintf("lag %d over target %d per member asks for %d", d.Lag, c.p.TargetLag, want)
	if capped {
		reason += fmt.Sprintf(", capped at %d (lanes or Max)", d.Cap)
	}
	if known != d.Lag {
		reason += fmt.Sprintf("; %d more on lanes not seen to progress, which only keeps the size from dropping below %d", known-d.Lag, floor)
	}
	if len(d.Stalled) > 0 {
		reason += fmt.Sprintf("; stalled lanes %s left out", strings.Join(d.Stalled, ","))
	}
	switch {
	case desired > current:
		c.downSince = time.Time{}
		if !c.lastUp.IsZero() && now.Sub(c.lastUp) < c.p.UpCooldown {
			d.Desired, d.Reason = current, reason+"; scale-up cooling down"
			return d
		}
		c.lastUp = now
		d.Action, d.Reason = "up", reason
	case desired < current:
		if c.downSince.IsZero() {
			c.downSince, c.downMax = now, desired
		}
		c.downMax = max(c.downMax, desired)
		if now.Sub(c.downSince) < c.p.DownDelay {
			d.Desired, d.Reason = current, reason+fmt.Sprintf("; waiting %v before scaling down", c.p.DownDelay-now.Sub(c.downSince))
			return d
		}
		d.Desired, d.Action, d.Reason = c.downMax, "down", reason+fmt.Sprintf(" (the most asked for over %v)", c.p.DownDelay)
		c.downSince = time.Time{}
	default:
		c.downSince = time.Time{}
		d.Reason = reason
	}
	return d
}

// size is the member count lag asks for.
func (c *Controller) size(lag int64) int {
	return int((lag + c.p.TargetLag - 1) / c.p.TargetLag)
}

func (c *Controller) report(d Decision) {
	level := slog.LevelDebug
	if d.Action != "hold" {
		level = slog.LevelInfo
	}
	lanes := make([]string, len(d.Lanes))
	for i, l := range d.Lanes {
		lanes[i] = fmt.Sprintf("%s:lag=%d,settled=%d", l.Lane, l.Lag, l.Settled)
		if !l.Known {
			lanes[i] = l.Lane + ":unknown"
		}
	}
	slices.Sort(lanes)
	c.logger.Log(context.Background(), level, "autoscale: decision",
		"action", d.Action, "current", d.Current, "desired", d.Desired, "lag", d.Lag,
		"cap", d.Cap, "stalled", d.Stalled, "lanes", lanes, "reason", d.Reason)
	if c.p.OnDecision != nil {
		c.p.OnDecision(d)
	}
}

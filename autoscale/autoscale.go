// Package autoscale sizes a consumer group from its lag, in messages or in
// time, across every process of the group.
//
// A Controller samples the group's lag and progress at a fixed interval
// and decides how many members the group needs. It acts in one of two
// ways:
//
//   - New: it scales the members running in this process
//     (omnibus.Consumer.Scale) to this process's share of what the group
//     needs. Every process of the group may run one; they do not add up
//     to twice the need.
//
//   - NewGroup: it scales nothing and publishes the group's desired member
//     count (Desired, Policy.OnDecision) for an orchestrator: package
//     autoscale/keda serves it to KEDA as an external scaler, and a
//     Prometheus gauge can export it for the Horizontal Pod Autoscaler.
//
//     k, _ := c.Subscribe(ctx, "orders", handle, omnibus.Group("billing"))
//     ctl, _ := autoscale.New(k, autoscale.Policy{TargetLag: 1000, TargetAge: time.Minute})
//     go ctl.Run(ctx)
//     k.Run(ctx)
//
// # Targets
//
// TargetLag is a lag per member, in the transport's unit (records on
// Kafka and membus, messages pending on brokers): the group needs the lag
// of its progressing lanes divided by TargetLag, rounded up. TargetAge is
// how long the oldest unsettled message of a lane may wait: the group
// needs its members times the oldest age over TargetAge, rounded up (a
// proportional step, as the Horizontal Pod Autoscaler takes), except that
// an age that fell since the last sample asks for no more members: the
// group is catching up, and the oldest message keeps aging until its turn
// comes. Given both, the larger need wins. TargetAge needs a transport
// that reports ages (Capabilities.Age); a lane whose age is unknown holds
// the size, as an unknown lag does.
//
// # The group's view
//
// The controller reads the lag of every lane of the group (Consumer.Lag
// reports them all, whoever holds them) and, where the transport counts
// them (driver.GroupMembersReader: Kafka's group, JetStream's leases,
// RabbitMQ's queue consumers), the members of every process. A lane
// progresses when this process settled on it since the previous sample,
// when its committed position rose (LaneLag.Committed) or when its lag
// fell, so a lane another process holds and works is never stalled for
// lack of progress here, and each lane's lag counts once for the group.
// A process running New takes its share of the group's need: the need
// times its members over the group's, rounded to the nearest (a half
// rounds up in the process holding the group's first lane alone, so two
// processes split an odd need exactly); at least one member. Without a
// member count from the transport, the controller sees one process, as if
// the group lived here alone.
//
// # Policy
//
//   - Never more members than lanes where the transport caps parallelism
//     (a partition is read by one member); a log line says when the cap,
//     not the target, limits the size. Min and Max bound the group.
//   - Up quickly, in one step to the size the lag asks for; down slowly,
//     after the lag has asked for fewer for DownDelay, to the largest size
//     asked for during that time. Each change causes a rebalance, so fewer,
//     larger steps are preferred.
//   - A lane's lag asks for more members once the lane is seen to
//     progress. A lane with lag that has not progressed for StallAfter
//     samples while the group's members stayed the same is stalled (a
//     poison message, a dead dependency): more members would not help, so
//     its lag does not ask for more. It still keeps the group from
//     shrinking. A lane that does not progress while members join or
//     leave is not called stalled (it may be waiting for its new owner),
//     but its lag does not ask for more members either.
//   - A lag read that fails, or a lane whose lag is unknown, holds the
//     current size: unknown is never read as zero.
//
// Scaling down is graceful: the leaving member's lanes are drained and
// committed before they move.
//
// Every decision is logged with its inputs and passed to
// Policy.OnDecision, so metrics can export the lag, the member count and
// the decisions.
//
// # Concurrency
//
// Run (or Step) samples and decides on one goroutine; Desired and Watch
// may be called from any.
package autoscale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Target is what a Controller made by New sizes. *omnibus.Consumer
// implements it.
type Target interface {
	Members() int
	Scale(ctx context.Context, n int) error
	Lag(ctx context.Context) ([]omnibus.LaneLag, error)
	Stats() omnibus.Stats
	Capabilities() omnibus.Capabilities
}

// GroupTarget is a Target that can count the members of its whole group,
// in every process. *omnibus.Consumer implements it; on a transport that
// cannot count them GroupMembers fails and the controller sees one
// process.
type GroupTarget interface {
	Target
	GroupMembers(ctx context.Context) (int, error)
}

// Policy configures a Controller. TargetLag, TargetAge or both are
// required.
type Policy struct {
	// TargetLag is the lag one member should carry, in the transport's
	// lag unit. The group needs the lag of lanes that progress divided by
	// TargetLag, rounded up.
	TargetLag int64
	// TargetAge is how long the oldest unsettled message of a lane may
	// wait. The group needs its members times the oldest age of lanes
	// that progress over TargetAge, rounded up. It needs a transport that
	// reports ages (Capabilities.Age).
	TargetAge time.Duration
	// Min is the fewest members of the group. Default: 1.
	Min int
	// Max is the most members of the group. Default: the lane count where
	// the transport caps parallelism, else 8.
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
	// OnDecision, when set, receives every decision, on the goroutine
	// running Run or Step.
	OnDecision func(Decision)
	// Hooks receive every decision after OnDecision: each value that
	// implements DecisionHook (a metrics collector, say; others are
	// ignored), in order, on the same goroutine.
	Hooks []omnibus.Hook
}

// DecisionHook is an omnibus.Hook that sees the autoscaler's decisions
// (Policy.Hooks). It must not block: the next sample waits for it.
type DecisionHook interface {
	OnDecision(Decision)
}

// Decision is one evaluation of the policy.
type Decision struct {
	Time time.Time
	// Topic and Group name the group, where the target tells them
	// (*omnibus.Consumer does).
	Topic, Group string
	// Current and Desired are the members this controller sizes: this
	// process's (New), or the group's (NewGroup), where Current is the
	// size last asked of the orchestrator, which may still be starting
	// it (Group is what runs).
	Current int
	Desired int
	// Action is "up", "down" or "hold".
	Action string
	Reason string
	// Members is the group's members in every process, as the transport
	// counts them; -1 when it cannot.
	Members int
	// GroupDesired is what the group's lag asks for, before cooldowns:
	// Desired is this process's share of it (New), or it after the
	// cooldowns (NewGroup).
	GroupDesired int
	// Active is true when the group has work: a lane with lag, or a lane
	// whose lag is unknown. An orchestrator that scales to zero starts the
	// group's first process on it.
	Active bool
	// Lag is the total lag of the lanes that progress; Stalled lanes are
	// left out of it.
	Lag int64
	// Age is the oldest age of the lanes that progress and have lag;
	// zero when none has, or the transport reports no ages.
	Age     time.Duration
	Cap     int
	Lanes   []LaneSample
	Stalled []string
}

// LaneSample is one lane as the controller saw it.
type LaneSample struct {
	Lane     string
	Lag      int64
	Known    bool
	Age      time.Duration
	AgeKnown bool
	// Local is true when a member of this process holds the lane.
	Local bool
	// Settled counts the messages this process settled on the lane so
	// far (omnibus.LaneStats.Settled); 0 outside the group.
	Settled int64
	// Committed is the group's position on the lane, where the transport
	// tells (omnibus.LaneLag.Committed).
	Committed int64
	Stalled   bool
}

// Controller runs the policy against one Target, or one group.
type Controller struct {
	p      Policy
	logger *slog.Logger
	hooks  []DecisionHook
	topic  string
	group  string
	read   func(ctx context.Context) (view, error)
	scale  func(ctx context.Context, n int) error // nil: publish only

	// Owned by Run's goroutine.
	history   map[string][]point // the last samples per lane
	lastUp    time.Time
	downSince time.Time
	downMax   int
	prevAge   time.Duration
	published int // the last Desired of a publishing controller

	mu      sync.Mutex // guards last and next
	last    Decision
	decided bool
	next    chan struct{} // closed at the next decision
}

// New returns a controller that scales t's members in this process to
// this process's share of what the group needs. It validates the policy
// and fills its defaults.
func New(t Target, p Policy) (*Controller, error) {
	if t == nil {
		return nil, fmt.Errorf("autoscale: nil target: %w", omnibus.ErrInvalid)
	}
	c, err := newController(p, t.Capabilities())
	if err != nil {
		return nil, err
	}
	c.read = func(ctx context.Context) (view, error) { return readTarget(ctx, t) }
	c.scale = t.Scale
	if n, ok := t.(interface {
		Topic() string
		Group() string
	}); ok {
		c.topic, c.group = n.Topic(), n.Group()
	}
	return c, nil
}

// NewGroup returns a controller that reads group's lag on topic and its
// members through client, from outside the group (Client.Lag,
// Client.Members), and scales nothing: it publishes the group's desired
// member count, after the policy's cooldowns, through Desired, Watch and
// Policy.OnDecision, for an orchestrator that runs the group's processes.
// The transport must read a group's lag from outside the group.
func NewGroup(client *omnibus.Client, topic, group string, p Policy) (*Controller, error) {
	if client == nil || topic == "" || group == "" {
		return nil, fmt.Errorf("autoscale: NewGroup needs a client, a topic and a group: %w", omnibus.ErrInvalid)
	}
	c, err := newController(p, client.Capabilities())
	if err != nil {
		return nil, err
	}
	c.read = func(ctx context.Context) (view, error) { return readGroup(ctx, client, topic, group) }
	c.topic, c.group = topic, group
	return c, nil
}

func newController(p Policy, caps omnibus.Capabilities) (*Controller, error) {
	switch {
	case p.TargetLag < 0 || p.TargetAge < 0:
		return nil, fmt.Errorf("autoscale: TargetLag %d and TargetAge %v must not be negative: %w", p.TargetLag, p.TargetAge, omnibus.ErrInvalid)
	case p.TargetLag == 0 && p.TargetAge == 0:
		return nil, fmt.Errorf("autoscale: set TargetLag, TargetAge or both: %w", omnibus.ErrInvalid)
	case p.TargetAge > 0 && !caps.Age:
		return nil, fmt.Errorf("autoscale: TargetAge: the transport reports no ages of lanes; use TargetLag: %w", omnibus.ErrUnsupported)
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
	c := &Controller{p: p, logger: p.Logger, history: map[string][]point{}, next: make(chan struct{})}
	for _, h := range p.Hooks {
		if h, ok := h.(DecisionHook); ok {
			c.hooks = append(c.hooks, h)
		}
	}
	return c, nil
}

// Run evaluates the policy every Interval until ctx ends, and returns
// nil then, or when the target is closed.
func (c *Controller) Run(ctx context.Context) error {
	tick := time.NewTicker(c.p.Interval)
	defer tick.Stop()
	for {
		if err := c.Step(ctx); errors.Is(err, omnibus.ErrClosed) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Step samples once, decides, and scales (New) or publishes (NewGroup).
// It returns the error of a scaling, or one wrapping ErrClosed when the
// target is closed; a lag read that fails holds the size, and the
// decision says why. Run calls it every Interval; tests and custom loops
// may call it directly.
func (c *Controller) Step(ctx context.Context) error {
	now := time.Now()
	v, err := c.read(ctx)
	d := c.decide(v, err, now)
	if !errors.Is(err, omnibus.ErrClosed) {
		err = nil // a failed read holds the size; the decision says why
	}
	if d.Action != "hold" && c.scale != nil {
		if err = c.scale(ctx, d.Desired); err != nil {
			d.Reason += "; scale failed: " + err.Error()
		}
	}
	if c.scale == nil {
		c.published = d.Desired
	}
	c.report(d)
	return err
}

// Desired is the group's desired member count of the last decision: for
// a controller made by NewGroup, after the cooldowns (what an
// orchestrator should run); for one made by New, what the group's lag
// asks for. It is 0 before the first decision.
func (c *Controller) Desired() int {
	d, ok, _ := c.Watch()
	switch {
	case !ok:
		return 0
	case c.scale == nil:
		return d.Desired
	}
	return d.GroupDesired
}

// Watch returns the last decision (ok false before the first) and a
// channel closed when the next one is made.
func (c *Controller) Watch() (last Decision, ok bool, next <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.decided, c.next
}

func (c *Controller) report(d Decision) {
	level := slog.LevelDebug
	if d.Action != "hold" {
		level = slog.LevelInfo
	}
	lanes := make([]string, len(d.Lanes))
	for i, l := range d.Lanes {
		lanes[i] = fmt.Sprintf("%s:lag=%d,settled=%d", l.Lane, l.Lag, l.Settled)
		switch {
		case !l.Known:
			lanes[i] = l.Lane + ":unknown"
		case l.AgeKnown:
			lanes[i] += ",age=" + l.Age.Round(time.Millisecond).String()
		}
	}
	slices.Sort(lanes)
	c.logger.Log(context.Background(), level, "autoscale: decision",
		"topic", d.Topic, "group", d.Group, "action", d.Action, "current", d.Current, "desired", d.Desired, "members", d.Members,
		"group_desired", d.GroupDesired, "lag", d.Lag, "age", d.Age, "cap", d.Cap,
		"stalled", d.Stalled, "lanes", lanes, "reason", d.Reason)
	c.mu.Lock()
	c.last, c.decided = d, true
	close(c.next)
	c.next = make(chan struct{})
	c.mu.Unlock()
	if c.p.OnDecision != nil {
		c.p.OnDecision(d)
	}
	for _, h := range c.hooks {
		h.OnDecision(d)
	}
}

package autoscale

// The policy: a view of the group (read from the target, or from outside
// the group), each lane's progress over the last samples, the group's
// need by lag and by age, this process's share of it, and the cooldowns.
// It runs on the goroutine calling Step and owns the controller's
// history.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus"
)

// view is one sample of the group.
type view struct {
	lags []omnibus.LaneLag
	// settled counts what this process settled on each lane a member of
	// it holds; nil outside the group.
	settled map[string]int64
	local   int // this process's members; 0 outside the group
	group   int // the group's members; -1 when the transport cannot tell
	caps    omnibus.Capabilities
	inside  bool // a process of the group, scaling its own members
}

func readTarget(ctx context.Context, t Target) (view, error) {
	v := view{local: t.Members(), group: -1, caps: t.Capabilities(), settled: map[string]int64{}, inside: true}
	var err error
	if v.lags, err = t.Lag(ctx); err != nil {
		return v, err
	}
	for _, l := range t.Stats().Lanes {
		if l.Member >= 0 {
			v.settled[l.Lane] = l.Settled
		}
	}
	if g, ok := t.(GroupTarget); ok {
		if n, err := g.GroupMembers(ctx); err == nil {
			v.group = max(n, v.local)
		}
	}
	return v, nil
}

func readGroup(ctx context.Context, c *omnibus.Client, topic, group string) (view, error) {
	v := view{group: -1, caps: c.Capabilities()}
	var err error
	if v.lags, err = c.Lag(ctx, topic, group); err != nil {
		return v, err
	}
	if n, err := c.Members(ctx, topic, group); err == nil {
		v.group = n
	}
	return v, nil
}

// point is one lane in one sample.
type point struct {
	settled   int64 // -1 when no member of this process held the lane
	committed int64
	lag       int64
	known     bool
	members   int // the group's (or this process's) members at the sample
}

// progressed reports whether the lane moved between two samples: this
// process settled on it, its committed position rose, or its lag fell.
func progressed(a, b point) bool {
	return a.settled >= 0 && b.settled > a.settled ||
		b.committed > a.committed ||
		a.known && b.known && b.lag < a.lag
}

func (c *Controller) decide(v view, err error, now time.Time) Decision {
	current := v.local
	if !v.inside {
		// What the orchestrator was asked for, which it may still be
		// starting: holding keeps asking for it.
		current = c.published
		if current == 0 {
			current = max(v.group, 0)
		}
	}
	d := Decision{Time: now, Topic: c.topic, Group: c.group, Current: current, Desired: current, Action: "hold", Members: v.group, GroupDesired: current}
	if err != nil {
		d.Active = true
		d.Reason = "lag unknown (" + err.Error() + "): holding"
		return d
	}
	members := v.group // the group's, as far as anyone here can tell
	if members < 0 {
		members = current
	}
	d.GroupDesired = members
	d.Cap = c.p.Max
	if v.caps.ExclusiveLanes && (d.Cap == 0 || len(v.lags) < d.Cap) {
		d.Cap = len(v.lags)
	}
	if d.Cap == 0 {
		d.Cap = 8
	}
	unknown, ageUnknown := false, false
	var known int64            // lag of every lane, progressing or not
	var oldest time.Duration   // age of every lane with lag
	for _, l := range v.lags { // lags come sorted by lane
		settled, local := v.settled[l.Lane]
		p := point{settled: -1, committed: l.Committed, lag: l.Lag, known: l.Known, members: members}
		if local {
			p.settled = settled
		}
		s := LaneSample{Lane: l.Lane, Lag: l.Lag, Known: l.Known, Age: l.Age, AgeKnown: l.AgeKnown, Local: local, Settled: settled, Committed: l.Committed}
		h := append(c.history[l.Lane], p)
		if len(h) > c.p.StallAfter+1 {
			h = h[len(h)-c.p.StallAfter-1:]
		}
		c.history[l.Lane] = h
		// A lane's lag counts once the lane is seen to progress: adding
		// members helps only lanes that move.
		progressing, steady := false, true
		for i := 1; i < len(h); i++ {
			progressing = progressing || progressed(h[i-1], h[i])
			steady = steady && h[i].members == h[0].members
		}
		if l.Known {
			known += l.Lag
			if l.Lag > 0 && l.AgeKnown {
				oldest = max(oldest, l.Age)
			}
		}
		switch {
		case !l.Known:
			unknown = true
		case l.Lag == 0:
		case progressing:
			d.Lag += l.Lag
			if !l.AgeKnown {
				ageUnknown = true
			}
			d.Age = max(d.Age, l.Age)
		case len(h) == c.p.StallAfter+1 && steady:
			// Judged over a window without members joining or leaving:
			// in a rebalance a lane may wait for a new owner.
			s.Stalled = true
			d.Stalled = append(d.Stalled, l.Lane)
		}
		d.Lanes = append(d.Lanes, s)
	}
	d.Active = unknown || known > 0
	switch {
	case unknown:
		d.Reason = "lag of some lane unknown: holding"
		return d
	case c.p.TargetAge > 0 && ageUnknown:
		d.Reason = "age of some progressing lane unknown: holding"
		return d
	}

	// The group's need: up on the lanes that progress; down only as far
	// as all the known lag allows, so a lane that looks stuck (or is
	// changing hands) never shrinks the group.
	var want, floor int
	var why []string
	if t := c.p.TargetLag; t > 0 {
		want, floor = ceilDiv(d.Lag, t), ceilDiv(known, t)
		why = append(why, fmt.Sprintf("lag %d over target %d per member asks for %d", d.Lag, t, want))
		if known != d.Lag {
			why = append(why, fmt.Sprintf("%d more on lanes not seen to progress keeps the group from dropping below %d", known-d.Lag, floor))
		}
	}
	if t := c.p.TargetAge; t > 0 {
		n := max(members, 1)
		byAge, ageFloor := ceilDiv(int64(n)*int64(d.Age), int64(t)), ceilDiv(int64(n)*int64(oldest), int64(t))
		note := ""
		if d.Age < c.prevAge && byAge > members {
			byAge, note = members, ", but the age fell since the last sample (catching up)"
		}
		why = append(why, fmt.Sprintf("age %v over target %v with %d members asks for %d%s", d.Age.Round(time.Millisecond), t, n, byAge, note))
		want, floor = max(want, byAge), max(floor, ageFloor)
	}
	c.prevAge = d.Age
	capped := want > d.Cap
	need := max(min(want, d.Cap), c.p.Min)
	if need <= members {
		need = max(min(floor, d.Cap, members), c.p.Min)
	}
	d.GroupDesired = need
	if capped {
		why = append(why, fmt.Sprintf("capped at %d (lanes or Max)", d.Cap))
	}
	if len(d.Stalled) > 0 {
		why = append(why, "stalled lanes "+strings.Join(d.Stalled, ",")+" left out")
	}
	desired := need
	if v.inside && v.group > 0 {
		desired = c.share(need, v)
		why = append(why, fmt.Sprintf("the group needs %d, of %d members now; this process's %d members take %d", need, v.group, v.local, desired))
	} else if v.inside {
		why = append(why, "the transport counts no group members: sizing as the group's only process")
	}
	c.apply(&d, desired, now, strings.Join(why, "; "))
	return d
}

// share is this process's part of the group's need: need times its
// members over the group's, rounded to the nearest, a half up only in
// the process holding the group's first lane (every process where lanes
// are shared), so that two processes split an odd need exactly; at least
// one member.
func (c *Controller) share(need int, v view) int {
	num, den := need*v.local, v.group
	n := num / den
	if r := num % den; 2*r > den || 2*r == den && c.first(v) {
		n++
	}
	return max(n, 1)
}

// first reports whether this process holds the group's first lane, or
// shares every lane.
func (c *Controller) first(v view) bool {
	if !v.caps.ExclusiveLanes || len(v.lags) == 0 {
		return true
	}
	_, ok := v.settled[v.lags[0].Lane]
	return ok
}

// apply moves d from its current size towards desired through the
// cooldowns: up at once unless one just happened, down after DownDelay
// to the most asked for meanwhile.
func (c *Controller) apply(d *Decision, desired int, now time.Time, reason string) {
	current := d.Current
	switch {
	case desired > current:
		c.downSince = time.Time{}
		if !c.lastUp.IsZero() && now.Sub(c.lastUp) < c.p.UpCooldown {
			d.Reason = reason + "; scale-up cooling down"
			return
		}
		c.lastUp = now
		d.Desired, d.Action, d.Reason = desired, "up", reason
	case desired < current:
		if c.downSince.IsZero() {
			c.downSince, c.downMax = now, desired
		}
		c.downMax = max(c.downMax, desired)
		if wait := c.p.DownDelay - now.Sub(c.downSince); wait > 0 {
			d.Reason = reason + fmt.Sprintf("; waiting %v before scaling down", wait)
			return
		}
		d.Desired, d.Action, d.Reason = c.downMax, "down", reason+fmt.Sprintf(" (the most asked for over %v)", c.p.DownDelay)
		c.downSince = time.Time{}
	default:
		c.downSince = time.Time{}
		d.Reason = reason
	}
}

// ceilDiv is a/b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b int64) int {
	return int((a + b - 1) / b)
}

package autoscale_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/autoscale"
)

// model is a consumer group in virtual time: arrivals at a rate that
// steps, spread evenly over lanes; each member handles one message per
// cost on the lanes it holds; a lane is held by one member at most.
type model struct {
	mu       sync.Mutex
	lanes    int
	cost     time.Duration
	rate     func(since time.Duration) float64 // messages per second
	start    time.Time
	last     time.Time
	lag      []float64
	settled  []float64
	members  int
	memberS  float64 // member-seconds spent
	scalings int
}

func newModel(lanes, members int, cost time.Duration, rate func(time.Duration) float64) *model {
	now := time.Now()
	return &model{lanes: lanes, cost: cost, rate: rate, start: now, last: now,
		lag: make([]float64, lanes), settled: make([]float64, lanes), members: members}
}

func (m *model) advanceLocked() {
	now := time.Now()
	dt := now.Sub(m.last).Seconds()
	m.last = now
	m.memberS += dt * float64(m.members)
	arrive := m.rate(now.Sub(m.start)) * dt / float64(m.lanes)
	// Each member serves lanes/members lanes at 1/cost messages per second
	// in all; a lane gets at most one member's throughput.
	perLane := min(float64(m.members)/float64(m.lanes), 1) / m.cost.Seconds() * dt
	for i := range m.lag {
		m.lag[i] += arrive
		done := min(m.lag[i], perLane)
		m.lag[i] -= done
		m.settled[i] += done
	}
}

func (m *model) total() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advanceLocked()
	sum := 0.0
	for _, l := range m.lag {
		sum += l
	}
	return sum
}

func (m *model) Members() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.members
}

func (m *model) Scale(_ context.Context, n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advanceLocked()
	m.members = n
	m.scalings++
	return nil
}

func (m *model) Lag(context.Context) ([]omnibus.LaneLag, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advanceLocked()
	out := make([]omnibus.LaneLag, m.lanes)
	for i, l := range m.lag {
		out[i] = omnibus.LaneLag{Lane: strconv.Itoa(i), Lag: int64(math.Round(l)), Known: true}
	}
	return out, nil
}

func (m *model) Stats() omnibus.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advanceLocked()
	var s omnibus.Stats
	for i, v := range m.settled {
		s.Lanes = append(s.Lanes, omnibus.LaneStats{Lane: strconv.Itoa(i), Settled: int64(v)})
	}
	return s
}

func (m *model) Capabilities() omnibus.Capabilities {
	return omnibus.Capabilities{ExclusiveLanes: true}
}

// TestSimulateStepLoad prints, in virtual time, how the controller answers
// a step up and a step down in load, next to fixed sizes of 1 and 12
// members: time for the lag per member to fall back under the target
// after the step up, the peak lag, the scaling events and the
// member-seconds spent. Run with -v to see the table.
func TestSimulateStepLoad(t *testing.T) {
	const (
		lanes     = 12
		cost      = 10 * time.Millisecond // 100 msgs/s per member
		targetLag = 500
		stepUp    = 60 * time.Second
		stepDown  = 300 * time.Second
		end       = 600 * time.Second
	)
	rate := func(since time.Duration) float64 {
		if since >= stepUp && since < stepDown {
			return 900 // needs 9 members
		}
		return 150 // needs 2
	}
	type result struct {
		name                string
		recover             time.Duration // after the step up; -1: never
		peak                float64
		events              int
		memberS             float64
		endMembers, maxSeen int
	}
	run := func(name string, members int, scale bool) (r result) {
		synctest.Test(t, func(t *testing.T) {
			m := newModel(lanes, members, cost, rate)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if scale {
				ctl, err := autoscale.New(m, autoscale.Policy{TargetLag: targetLag, Interval: 5 * time.Second,
					UpCooldown: 15 * time.Second, DownDelay: 2 * time.Minute, Logger: quiet()})
				if err != nil {
					t.Fatal(err)
				}
				go ctl.Run(ctx)
			}
			r = result{name: name, recover: -1}
			over := false
			for now := time.Duration(0); now < end; now += time.Second {
				time.Sleep(time.Second)
				lag, n := m.total(), m.Members()
				r.peak = max(r.peak, lag)
				r.maxSeen = max(r.maxSeen, n)
				// The target is a lag per member, as the policy reads it.
				switch under := lag <= float64(targetLag*n); {
				case now >= stepUp && now < stepDown && !under:
					over = true
				case over && r.recover < 0 && now < stepDown && under:
					r.recover = now - stepUp
				}
			}
			if !over {
				r.recover = 0
			}
			cancel()
			synctest.Wait()
			r.events, r.memberS, r.endMembers = m.scalings, m.memberS, m.Members()
		})
		return r
	}
	results := []result{
		run("autoscale 1..12", 1, true),
		run("fixed 1", 1, false),
		run("fixed 12", lanes, false),
	}
	t.Logf("step load on %d lanes, %v per message: 150 msgs/s, 900 msgs/s from %v to %v, target lag %d per member", lanes, cost, stepUp, stepDown, targetLag)
	t.Logf("%-16s %-22s %10s %8s %15s %12s", "policy", "under target after", "peak lag", "events", "member-seconds", "members max/end")
	for _, r := range results {
		rec := "never"
		if r.recover >= 0 {
			rec = r.recover.String()
		}
		t.Logf("%-16s %-22s %10.0f %8d %15.0f %12s", r.name, rec, r.peak, r.events, r.memberS, fmt.Sprintf("%d/%d", r.maxSeen, r.endMembers))
	}
	auto, fixed12 := results[0], results[2]
	if auto.recover < 0 || auto.memberS >= fixed12.memberS || auto.endMembers > 2 || auto.events > 8 {
		t.Errorf("autoscale: %+v; want recovery, fewer member-seconds than 12 fixed (%0.f), back to at most 2 members, at most 8 events", auto, fixed12.memberS)
	}
}

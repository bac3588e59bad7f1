package omnibus

// What the consumer tells about itself and its group: lag from the
// transport, and the engine's own counters.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag reports the group's lag per lane, from the transport: messages
// (Lag) and, where Capabilities().Age, the age of the oldest unsettled
// message (Age). A lane whose lag the transport could not read has Known
// false, and one whose age it could not tell AgeKnown false; neither is
// ever reported as zero. Lag returns a *CapabilityError on transports without lag.
func (k *Consumer) Lag(ctx context.Context) ([]LaneLag, error) {
	k.mu.Lock()
	var readers []driver.LagReader
	for _, m := range k.members {
		if r, ok := m.sub.(driver.LagReader); ok {
			readers = append(readers, r)
		}
	}
	stopping := k.stopping
	k.mu.Unlock()
	if stopping {
		return nil, fmt.Errorf("omnibus: lag %q: %w", k.topic, ErrClosed)
	}
	if _, ok := k.client.conn.(driver.GroupLagReader); ok || len(readers) == 0 {
		return k.client.Lag(ctx, k.topic, k.cfg.group)
	}
	// Each member tells at least about its own lanes: take every lane's
	// known report.
	byLane := map[string]LaneLag{}
	for _, r := range readers {
		lags, err := r.Lag(ctx)
		if err != nil {
			return nil, fmt.Errorf("omnibus: lag %q group %q: %w", k.topic, k.cfg.group, err)
		}
		for _, l := range lags {
			if old, seen := byLane[l.Lane]; !seen || !old.Known {
				byLane[l.Lane] = l
			}
		}
	}
	return sortLags(slices.Collect(maps.Values(byLane))), nil
}

func sortLags(lags []LaneLag) []LaneLag {
	slices.SortFunc(lags, func(a, b LaneLag) int { return compareLanes(a.Lane, b.Lane) })
	return lags
}

// Lag reports a consumer group's lag per lane of topic without joining the
// group, on transports that can (see driver.GroupLagReader); elsewhere it
// returns a *CapabilityError.
func (c *Client) Lag(ctx context.Context, topic, group string) ([]LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	r, ok := c.conn.(driver.GroupLagReader)
	if !ok {
		return nil, &CapabilityError{Scheme: c.scheme, Capability: "lag", Detail: "the transport cannot read a group's lag from outside the group"}
	}
	lags, err := r.GroupLag(ctx, topic, group)
	if err != nil {
		return nil, fmt.Errorf("omnibus: lag %q group %q: %w", topic, group, err)
	}
	return sortLags(lags), nil
}

// Members reports how many members a consumer group has, across every
// process, on transports that can count them without joining the group
// (see driver.GroupMembersReader); elsewhere it returns a
// *CapabilityError. A group the transport does not know is ErrNotFound.
func (c *Client) Members(ctx context.Context, topic, group string) (int, error) {
	if err := c.checkOpen("members", topic); err != nil {
		return 0, err
	}
	r, ok := c.conn.(driver.GroupMembersReader)
	if !ok {
		return 0, &CapabilityError{Scheme: c.scheme, Capability: "members", Detail: "the transport cannot count a group's members"}
	}
	n, err := r.GroupMembers(ctx, topic, group)
	if err != nil {
		return 0, fmt.Errorf("omnibus: members %q group %q: %w", topic, group, err)
	}
	return n, nil
}

// GroupMembers is Client.Members for the consumer's group: the members of
// every process, where Members counts this consumer's own.
func (k *Consumer) GroupMembers(ctx context.Context) (int, error) {
	return k.client.Members(ctx, k.topic, k.cfg.group)
}

// LaneLag is the lag of one lane, in messages (Lag) and in time (Age: how
// long the oldest unsettled message has waited); see driver.LaneLag for
// what each transport can tell.
type LaneLag = driver.LaneLag

// Stats is a snapshot of the consumer's engine.
type Stats struct {
	Members   int
	InFlight  int   // messages received and not settled
	Processed int64 // messages settled since the consumer started
	Lanes     []LaneStats
}

// LaneStats is one lane in a Stats snapshot: every lane the consumer has
// held, claimed now or not.
type LaneStats struct {
	Lane string
	// Member is the index of the member holding the lane, -1 when none
	// does now (the lane is changing hands, or went to another process).
	Member   int
	InFlight int
	// Settled counts the lane's messages this consumer has settled and
	// committed past (on logs: passed by the watermark), across members.
	// A lane with lag whose Settled does not move is stalled.
	Settled int64
}

func (k *Consumer) laneCounter(id string) *atomic.Int64 {
	k.settledMu.Lock()
	defer k.settledMu.Unlock()
	c := k.settled[id]
	if c == nil {
		c = new(atomic.Int64)
		k.settled[id] = c
	}
	return c
}

// Stats returns a snapshot of the engine's counters.
func (k *Consumer) Stats() Stats {
	k.mu.Lock()
	members := slices.Clone(k.members)
	k.mu.Unlock()
	s := Stats{Members: len(members)}
	claimed := map[string]bool{}
	for _, m := range members {
		m.mu.Lock()
		s.InFlight += m.inflight
		for _, l := range m.lanes {
			claimed[l.id] = true
			s.Lanes = append(s.Lanes, LaneStats{Lane: l.id, Member: m.id, InFlight: l.inflight, Settled: l.settled.Load()})
		}
		m.mu.Unlock()
		s.Processed += m.processed.Load()
	}
	// Lanes between owners keep their count.
	k.settledMu.Lock()
	for id, n := range k.settled {
		if !claimed[id] {
			s.Lanes = append(s.Lanes, LaneStats{Lane: id, Member: -1, Settled: n.Load()})
		}
	}
	k.settledMu.Unlock()
	slices.SortFunc(s.Lanes, func(a, b LaneStats) int { return compareLanes(a.Lane, b.Lane) })
	return s
}

// compareLanes orders lane names numerically when both are numbers.
func compareLanes(a, b string) int {
	if len(a) != len(b) && isDigits(a) && isDigits(b) {
		return len(a) - len(b)
	}
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

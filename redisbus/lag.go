package redisbus

// Lag: the member's lanes (Lag) and any group's (GroupLag,
// GroupMembers), read with XINFO GROUPS on the caller's goroutine;
// sub.mu guards the lanes Lag walks.

import (
	"context"
	"fmt"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: XINFO GROUPS lag + pending of every
// lane the member holds. A failed read, or a lag Redis cannot tell
// (entries deleted from the middle of the stream), is Known false.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	lanes := s.activeLanes()
	lags := make([]driver.LaneLag, len(lanes))
	for i, l := range lanes {
		lags[i] = driver.LaneLag{Lane: l.id}
		lags[i].Lag, lags[i].Known, _ = s.c.streamLag(ctx, l.stream, s.group)
	}
	return lags, nil
}

// streamLag returns group's lag on stream: the entries it has not read
// (XINFO GROUPS lag) plus those read and not acknowledged (pending).
// found is false when the stream or the group does not exist.
func (c *conn) streamLag(ctx context.Context, stream, group string) (lag int64, known, found bool) {
	groups, err := c.rdb.XInfoGroups(ctx, stream).Result()
	if err != nil {
		return 0, false, false
	}
	for _, g := range groups {
		if g.Name == group {
			if g.Lag < 0 {
				return 0, false, true
			}
			return g.Lag + g.Pending, true, true
		}
	}
	return 0, false, false
}

// GroupLag implements driver.GroupLagReader: lag + pending of group on
// every lane of topic ("0" unpartitioned, a lane per partition), read
// without joining the group. A topic without streams, or a group on none
// of them, is an error wrapping ErrNotFound.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	parts, err := c.rdb.Get(ctx, layoutKey(topic)).Int()
	if err != nil && !isNil(err) {
		return nil, fmt.Errorf("redisbus: lag %q group %q: %w", topic, group, classify(err))
	}
	found := 0
	lags := make([]driver.LaneLag, max(parts, 1))
	for i, stream := range streamsOf(topic, parts) {
		var ok bool
		lags[i].Lane = laneID(i)
		lags[i].Lag, lags[i].Known, ok = c.streamLag(ctx, stream, group)
		if ok {
			found++
		}
	}
	if found == 0 {
		return nil, fmt.Errorf("redisbus: lag %q group %q: no such group on the topic's streams: %w", topic, group, driver.ErrNotFound)
	}
	return lags, nil
}

// GroupMembers reports how many members group has: the members whose
// heartbeat has not run out (unpartitioned: claim_idle after the last,
// renewed every quarter of it; partitioned: lease_ttl). The CLI's
// omnibus lag uses it to tell a stopped group from a stalled one.
func (c *conn) GroupMembers(ctx context.Context, topic, group string) (int, error) {
	if err := c.checkOpen("members", topic); err != nil {
		return 0, err
	}
	n, err := countScript.Run(ctx, c.rdb, []string{membersKey(topic, group)}).Int()
	if err != nil {
		return 0, fmt.Errorf("redisbus: members %q group %q: %w", topic, group, classify(err))
	}
	return n, nil
}

package redisbus

// Lag: the member's lanes (Lag) and any group's (GroupLag,
// GroupMembers), read with XINFO GROUPS (and, for the age, TIME and
// XPENDING or XRANGE) on the caller's goroutine;
// sub.mu guards the lanes Lag walks.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: XINFO GROUPS lag + pending of every
// lane the member holds, and the age of each lane's oldest unsettled
// entry (laneLag). A failed read, or a lag Redis cannot tell (entries
// deleted from the middle of the stream), is Known false.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	lanes := s.activeLanes()
	lags := make([]driver.LaneLag, len(lanes))
	for i, l := range lanes {
		lags[i], _ = s.c.laneLag(ctx, l.id, l.stream, s.group)
	}
	return lags, nil
}

// laneLag returns group's lag on stream: the entries it has not read
// (XINFO GROUPS lag) plus those read and not acknowledged (pending); and
// its age, from the oldest of those: the group's lowest pending entry
// (XPENDING), else the first entry after its last-delivered-id. An
// entry ID begins with the server's time of the XADD in milliseconds,
// so the age is the server's time (TIME) minus that. With nothing
// pending and nothing after the last-delivered-id the age is a known 0;
// a read that fails leaves it unknown. found is false when the stream or
// the group does not exist.
func (c *conn) laneLag(ctx context.Context, lane, stream, group string) (l driver.LaneLag, found bool) {
	l.Lane = lane
	var info *redis.XInfoGroupsCmd
	var now *redis.TimeCmd
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		info = p.XInfoGroups(ctx, stream)
		return nil
	})
	groups, err := info.Result()
	if err != nil {
		return l, false
	}
	i := slices.IndexFunc(groups, func(g redis.XInfoGroup) bool { return g.Name == group })
	if i < 0 {
		return l, false
	}
	g := groups[i]
	if g.Lag >= 0 {
		l.Lag, l.Known = g.Lag+g.Pending, true
	}
	at, err := now.Result()
	if err != nil {
		return l, true
	}
	var oldest string
	switch {
	case g.Pending > 0:
		p, err := c.rdb.XPending(ctx, stream, group).Result()
		if err != nil {
			return l, true
		}
		oldest = p.Lower
	case g.Lag == 0:
		// Nothing pending, nothing unread.
	default:
		next, err := c.rdb.XRangeN(ctx, stream, "("+g.LastDeliveredID, "+", 1).Result()
		if err != nil {
			return l, true
		}
		if len(next) > 0 {
			oldest = next[0].ID
		}
	}
	if oldest == "" {
		l.SetAge(at, at)
		return l, true
	}
	if ms, ok := idTime(oldest); ok {
		l.SetAge(at, ms)
	}
	return l, true
}

// idTime returns the time an entry ID ("<ms>-<seq>") begins with.
func idTime(id string) (time.Time, bool) {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

// GroupLag implements driver.GroupLagReader: lag + pending and age
// (laneLag) of group on every lane of topic ("0" unpartitioned, a lane per partition), read
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
		if lags[i], ok = c.laneLag(ctx, laneID(i), stream, group); ok {
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

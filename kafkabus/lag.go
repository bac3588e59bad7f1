package kafkabus

// Lag: per partition, the high watermark minus the group's committed
// offset (or minus the log start where the group has none), read through
// the admin client, and its age (age.go); a failed read is unknown, never
// zero. The group's members (GroupMembers) come from DescribeGroups. Called from any
// goroutine; it holds no lock of the member's but sub.mu for a moment.

import (
	"context"
	"fmt"
	"slices"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: for every partition of the topic, the
// high watermark minus the group's committed offset, or minus the log
// start offset when the group has committed nothing there. A partition
// whose offsets cannot be read has Known false.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	s.mu.Lock()
	n := s.partitions
	s.mu.Unlock()
	lags, err := s.conn.lag(ctx, s.topic, s.group, n)
	if err == nil {
		s.mu.Lock()
		s.partitions = len(lags)
		s.mu.Unlock()
	}
	return lags, err
}

// GroupLag implements driver.GroupLagReader: the lag of group on every
// partition of topic, read with the admin client, without joining. A
// group the cluster does not know is ErrNotFound.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	groups, err := c.adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: lag %q group %q: %w", topic, group, classify(err))
	}
	if g, ok := groups[group]; !ok || g.State == "Dead" {
		return nil, fmt.Errorf("kafkabus: lag %q: group %q: %w", topic, group, driver.ErrNotFound)
	}
	return c.lag(ctx, topic, group, 0)
}

// GroupMembers implements driver.GroupMembersReader: the members of the
// group as the group coordinator describes it (every process's), whatever
// topics they read. A group the cluster does not know, or one without
// members and commits, is ErrNotFound.
func (c *conn) GroupMembers(ctx context.Context, topic, group string) (int, error) {
	if err := c.checkOpen("members", topic); err != nil {
		return 0, err
	}
	groups, err := c.adm.DescribeGroups(ctx, group)
	if err == nil {
		err = groups.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("kafkabus: members %q group %q: %w", topic, group, classify(err))
	}
	g, ok := groups[group]
	if !ok || g.State == "Dead" {
		return 0, fmt.Errorf("kafkabus: members %q: group %q: %w", topic, group, driver.ErrNotFound)
	}
	return len(g.Members), nil
}

// lag reads the group's lag on every partition of topic: the end offset
// minus the committed offset, or minus the log start where the group has
// committed nothing, and the age of the record there. known is the partition count from an earlier read,
// so that a failed read still lists every partition, as unknown.
func (c *conn) lag(ctx context.Context, topic, group string, known int) ([]driver.LaneLag, error) {
	adm := c.adm
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil && len(ends) == 0 {
		if known == 0 {
			return nil, fmt.Errorf("kafkabus: lag %q: end offsets: %w", topic, classify(err))
		}
		lags := make([]driver.LaneLag, known)
		for p := range lags {
			lags[p] = driver.LaneLag{Lane: laneName(int32(p))}
		}
		return lags, nil
	}
	topicEnds := ends[topic]
	if bad, ok := topicEnds[-1]; ok && bad.Err != nil {
		return nil, fmt.Errorf("kafkabus: lag %q: %w", topic, classify(bad.Err))
	}
	starts, serr := adm.ListStartOffsets(ctx, topic)
	committed, cerr := adm.FetchOffsets(ctx, group)
	parts := make([]int32, 0, len(topicEnds))
	for p := range topicEnds {
		if p >= 0 {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	lags := make([]driver.LaneLag, 0, len(parts))
	for _, p := range parts {
		end := topicEnds[p]
		l := driver.LaneLag{Lane: laneName(p)}
		from := int64(-1)
		if cerr == nil {
			if o, ok := committed.Lookup(topic, p); ok && o.Err == nil && o.At >= 0 {
				from = o.At
			} else if !ok || o.Err == nil {
				if st, ok := starts.Lookup(topic, p); ok && serr == nil && st.Err == nil && st.Offset >= 0 {
					from = st.Offset
				}
			}
		}
		if end.Err == nil && end.Offset >= 0 && from >= 0 {
			l.Lag, l.Known, l.Committed = max(end.Offset-from, 0), true, from
		}
		lags = append(lags, l)
	}
	c.ages(ctx, topic, group, parts, lags)
	return lags, nil
}

package nsqbus

// Lag: what a channel has not finished, from each nsqd's /stats: its
// depth (in memory and on disk), the messages in flight and those
// deferred (REQ with a delay), summed over the nsqds that hold the
// topic; and the channel's consumers (GroupMembers). Calls run on the
// caller's goroutine.

import (
	"context"
	"fmt"
	"net/url"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: the channel's one lane, Known false
// when an nsqd could not be read.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	n, _, err := s.c.channelStats(ctx, s.nsqTop, s.channel)
	if err != nil {
		s.c.log.Warn("cannot read the group's lag", "topic", s.topic, "channel", s.channel, "err", err)
		return []driver.LaneLag{{Lane: lane}}, nil
	}
	return []driver.LaneLag{{Lane: lane, Lag: n, Known: true}}, nil
}

// GroupLag implements driver.GroupLagReader: the lag of the channel of
// group (a group the user named) on topic.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	n, _, err := c.groupStats(ctx, "lag", topic, group)
	if err != nil {
		return nil, err
	}
	return []driver.LaneLag{{Lane: lane, Lag: n, Known: true}}, nil
}

// GroupMembers reports how many members group has: the consumers of its
// channel on every nsqd (a member connected to k nsqds counts k times).
func (c *conn) GroupMembers(ctx context.Context, topic, group string) (int, error) {
	_, clients, err := c.groupStats(ctx, "members", topic, group)
	return clients, err
}

func (c *conn) groupStats(ctx context.Context, op, topic, group string) (int64, int, error) {
	nsqTop, err := topicName(topic)
	if err == nil {
		var channel string
		if channel, err = channelName(group, false); err == nil {
			var lag int64
			var clients int
			if lag, clients, err = c.channelStats(ctx, nsqTop, channel); err == nil {
				return lag, clients, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("nsqbus: %s of topic %q group %q: %w", op, topic, group, err)
}

// channelStats is the part of nsqd's /stats a lag needs.
type channelStats struct {
	Topics []struct {
		Name     string `json:"topic_name"`
		Channels []struct {
			Name     string `json:"channel_name"`
			Depth    int64  `json:"depth"`
			InFlight int64  `json:"in_flight_count"`
			Deferred int64  `json:"deferred_count"`
			Clients  int    `json:"client_count"`
		} `json:"channels"`
	} `json:"topics"`
}

// channelStats sums the channel's depth, in-flight and deferred counts,
// and its consumers, over the nsqds holding the topic. It fails wrapping
// driver.ErrNotFound when no nsqd has the channel.
func (c *conn) channelStats(ctx context.Context, topic, channel string) (lag int64, clients int, err error) {
	nodes, err := c.nodes(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	found := false
	q := url.Values{"format": {"json"}, "topic": {topic}, "channel": {channel}, "include_clients": {"false"}}
	for _, n := range nodes {
		var st channelStats
		if err := c.get(ctx, n.http, "/stats", q, &st); err != nil {
			return 0, 0, fmt.Errorf("nsqd %s: %w", n.http, err)
		}
		for _, t := range st.Topics {
			for _, ch := range t.Channels {
				if t.Name == topic && ch.Name == channel {
					found = true
					lag += ch.Depth + ch.InFlight + ch.Deferred
					clients += ch.Clients
				}
			}
		}
	}
	if !found {
		return 0, 0, fmt.Errorf("no nsqd has channel %q of topic %q: %w", channel, topic, driver.ErrNotFound)
	}
	return lag, clients, nil
}

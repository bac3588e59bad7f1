package nsqbus

// Lag: what a channel has not finished, from each nsqd's /stats: its
// depth (in memory and on disk), the messages in flight and those
// deferred (REQ with a delay), summed over the nsqds that hold the
// topic. Calls run on the caller's goroutine.

import (
	"context"
	"fmt"
	"net/url"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: the channel's one lane, Known false
// when an nsqd could not be read.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	n, err := s.c.channelLag(ctx, s.nsqTop, s.channel)
	if err != nil {
		s.c.log.Warn("cannot read the group's lag", "topic", s.topic, "channel", s.channel, "err", err)
		return []driver.LaneLag{{Lane: lane}}, nil
	}
	return []driver.LaneLag{{Lane: lane, Lag: n, Known: true}}, nil
}

// GroupLag implements driver.GroupLagReader: the lag of the channel of
// group (a group the user named) on topic.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	nsqTop, err := topicName(topic)
	if err != nil {
		return nil, fmt.Errorf("nsqbus: lag: %w", err)
	}
	channel, err := channelName(group, false)
	if err != nil {
		return nil, fmt.Errorf("nsqbus: lag: %w", err)
	}
	n, err := c.channelLag(ctx, nsqTop, channel)
	if err != nil {
		return nil, fmt.Errorf("nsqbus: lag of topic %q group %q: %w", topic, group, err)
	}
	return []driver.LaneLag{{Lane: lane, Lag: n, Known: true}}, nil
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
		} `json:"channels"`
	} `json:"topics"`
}

// channelLag sums the channel's depth, in-flight and deferred counts
// over the nsqds holding the topic. It fails wrapping driver.ErrNotFound
// when no nsqd has the channel.
func (c *conn) channelLag(ctx context.Context, topic, channel string) (int64, error) {
	nodes, err := c.nodes(ctx, topic)
	if err != nil {
		return 0, err
	}
	var total int64
	found := false
	q := url.Values{"format": {"json"}, "topic": {topic}, "channel": {channel}, "include_clients": {"false"}}
	for _, n := range nodes {
		var st channelStats
		if err := c.get(ctx, n.http, "/stats", q, &st); err != nil {
			return 0, fmt.Errorf("nsqd %s: %w", n.http, err)
		}
		for _, t := range st.Topics {
			for _, ch := range t.Channels {
				if t.Name == topic && ch.Name == channel {
					found = true
					total += ch.Depth + ch.InFlight + ch.Deferred
				}
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("no nsqd has channel %q of topic %q: %w", channel, topic, driver.ErrNotFound)
	}
	return total, nil
}

package nsqbus

// Lag: what a channel has not finished, from each nsqd's /stats: its
// depth (in memory and on disk), the messages in flight and those
// deferred (REQ with a delay), summed over the nsqds that hold the
// topic; the age, where the oldest message this client holds is
// certainly the channel's oldest; and the channel's consumers
// (GroupMembers). Calls run on the caller's goroutine; sub.mu guards the
// held messages read for the age.

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: the channel's one lane, Known false
// when an nsqd could not be read, with its age where this client can
// tell it (laneLag).
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	nodes, err := s.c.channelStats(ctx, s.nsqTop, s.channel)
	if err != nil {
		s.c.log.Warn("cannot read the group's lag", "topic", s.topic, "channel", s.channel, "err", err)
		return []driver.LaneLag{{Lane: lane}}, nil
	}
	return []driver.LaneLag{s.c.laneLag(s.nsqTop, s.channel, nodes)}, nil
}

// GroupLag implements driver.GroupLagReader: the lag of the channel of
// group (a group the user named) on topic, with its age where this
// client can tell it (laneLag).
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	nsqTop, channel, nodes, err := c.groupStats(ctx, "lag", topic, group)
	if err != nil {
		return nil, err
	}
	return []driver.LaneLag{c.laneLag(nsqTop, channel, nodes)}, nil
}

// GroupMembers reports how many members group has: the consumers of its
// channel on every nsqd (a member connected to k nsqds counts k times).
func (c *conn) GroupMembers(ctx context.Context, topic, group string) (int, error) {
	_, _, nodes, err := c.groupStats(ctx, "members", topic, group)
	clients := 0
	for _, n := range nodes {
		clients += n.Clients
	}
	return clients, err
}

func (c *conn) groupStats(ctx context.Context, op, topic, group string) (nsqTop, channel string, nodes []nodeStats, err error) {
	if nsqTop, err = topicName(topic); err == nil {
		if channel, err = channelName(group, false); err == nil {
			if nodes, err = c.channelStats(ctx, nsqTop, channel); err == nil {
				return nsqTop, channel, nodes, nil
			}
		}
	}
	return "", "", nil, fmt.Errorf("nsqbus: %s of topic %q group %q: %w", op, topic, group, err)
}

// laneLag is the channel's lag: its depth, in-flight and deferred
// messages summed over the nsqds. Its age is known where the channel's
// oldest message is certain (nodeStats.age) on every nsqd that has a
// lag; unknown anywhere else, since nsqd's /stats shows no message's
// time and a message shows its own only when it is delivered.
func (c *conn) laneLag(nsqTop, channel string, nodes []nodeStats) driver.LaneLag {
	l := driver.LaneLag{Lane: lane, Known: true}
	held := c.held(nsqTop, channel)
	now := time.Now()
	oldest, known := now, true
	for _, n := range nodes {
		l.Lag += n.lag()
		at, ok := n.oldest(held[n.tcp])
		known = known && ok
		if ok && at.Before(oldest) {
			oldest = at
		}
	}
	if known {
		l.SetAge(now, oldest)
	}
	return l
}

// hold is what a client's members hold unanswered from one nsqd on one
// channel: how many, and the oldest's nsqd timestamp.
type hold struct {
	n      int64
	oldest time.Time
}

// held returns what the connection's members of channel hold
// unanswered, by the TCP address of the nsqd that sent it.
func (c *conn) held(nsqTop, channel string) map[string]hold {
	out := map[string]hold{}
	for _, s := range c.subs.All() {
		if s.nsqTop != nsqTop || s.channel != channel {
			continue
		}
		s.mu.Lock()
		for m := range s.held {
			h := out[m.NSQDAddress]
			at := time.Unix(0, m.Timestamp)
			if h.n == 0 || at.Before(h.oldest) {
				h.oldest = at
			}
			h.n++
			out[m.NSQDAddress] = h
		}
		s.mu.Unlock()
	}
	return out
}

// statsReply is the part of nsqd's /stats a lag needs.
type statsReply struct {
	Topics []struct {
		Name     string      `json:"topic_name"`
		Backend  int64       `json:"backend_depth"`
		Channels []nodeStats `json:"channels"`
	} `json:"topics"`
}

// nodeStats is a channel on one nsqd.
type nodeStats struct {
	Name     string `json:"channel_name"`
	Depth    int64  `json:"depth"`
	Backend  int64  `json:"backend_depth"`
	InFlight int64  `json:"in_flight_count"`
	Deferred int64  `json:"deferred_count"`
	Requeued int64  `json:"requeue_count"`
	TimedOut int64  `json:"timeout_count"`
	Clients  int    `json:"client_count"`

	tcp          string // the nsqd's address for clients
	topicBackend int64  // its topic's messages on disk
}

// lag is what the channel has not finished on this nsqd.
func (n nodeStats) lag() int64 { return n.Depth + n.InFlight + n.Deferred }

// oldest returns the time of the channel's oldest unfinished message on
// this nsqd, where it is certain: none (now) when the channel has no
// lag; else the oldest message h this client holds from the nsqd, when
// every message in flight there is this client's (h.n equals the
// in-flight count), none is deferred, and those waiting came after it:
// nsqd's in-memory queues are first in, first out, but a message
// requeued (REQ) or timed out goes back behind newer ones, and one on
// disk (beyond --mem-queue-size) may come out before older ones in
// memory, so a channel that ever requeued or timed out a message, or
// has messages on disk (topic or channel), is unknown.
func (n nodeStats) oldest(h hold) (time.Time, bool) {
	switch {
	case n.lag() == 0:
		return time.Now(), true
	case h.n > 0 && h.n == n.InFlight && n.Deferred == 0 && n.Requeued == 0 && n.TimedOut == 0 &&
		n.Backend == 0 && n.topicBackend == 0:
		return h.oldest, true
	}
	return time.Time{}, false
}

// channelStats reads the channel on every nsqd holding the topic. It
// fails wrapping driver.ErrNotFound when no nsqd has the channel.
func (c *conn) channelStats(ctx context.Context, topic, channel string) ([]nodeStats, error) {
	var out []nodeStats
	err := c.eachStats(ctx, topic, channel, func(n node, st *statsReply) {
		for _, t := range st.Topics {
			for _, ch := range t.Channels {
				if t.Name == topic && ch.Name == channel {
					ch.tcp, ch.topicBackend = n.tcp, t.Backend
					out = append(out, ch)
				}
			}
		}
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no nsqd has channel %q of topic %q: %w", channel, topic, driver.ErrNotFound)
	}
	return out, nil
}

// eachStats reads /stats, for topic (and channel, when not ""), of every
// nsqd holding topic, and calls f with each nsqd and its answer.
func (c *conn) eachStats(ctx context.Context, topic, channel string, f func(node, *statsReply)) error {
	nodes, err := c.nodes(ctx, topic)
	if err != nil {
		return err
	}
	q := url.Values{"format": {"json"}, "topic": {topic}, "include_clients": {"false"}}
	if channel != "" {
		q.Set("channel", channel)
	}
	for _, n := range nodes {
		var st statsReply
		if err := c.get(ctx, n.http, "/stats", q, &st); err != nil {
			return fmt.Errorf("nsqd %s: %w", n.http, err)
		}
		f(n, &st)
	}
	return nil
}

package rabbitbus

// Lag: the member's lanes (Lag) and any group's (GroupLag,
// GroupMembers), read with passive queue declares, plus the deliveries
// the connection's subscribers hold unacknowledged, whose oldest gives a
// lane's age. It runs on the caller's goroutine (queueCounts on the
// rebalancer's too); sub.mu guards the held counts and times.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

var _ driver.GroupLagReader = (*conn)(nil)

// Lag implements driver.LagReader: for every lane of the group, the
// messages ready in its queue (queue.declare-ok) plus the deliveries
// this client holds unacknowledged on it, and the lane's age (laneLag).
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	counts := s.queueCounts(ctx)
	held := s.c.held()
	out := make([]driver.LaneLag, len(s.lanes))
	for i, l := range s.lanes {
		out[i] = driver.LaneLag{Lane: l.id}
		if q, ok := counts[l.queue]; ok {
			out[i] = held[l.queue].laneLag(l.id, q, s.part)
		}
	}
	return out, nil
}

// holding is what a client's members hold unacknowledged on one queue.
type holding struct {
	n         int       // deliveries held
	oldest    time.Time // the oldest held delivery's message time
	untimed   bool      // a lane's oldest held delivery has no time
	consumers int       // the client's consumers on the queue
}

// laneLag is the lag of the lane on queue q, as the client holding h
// sees it: the ready messages plus those held. Its age is that of the
// oldest message held, where that is the queue's oldest unacknowledged
// one: a queue hands out its head first, so it is, when the client holds
// any and is the only consumer that may (a partition queue's single
// active consumer is the only one with deliveries; an unpartitioned
// queue's other consumers may hold older ones). With nothing held and
// nothing ready, and no consumer but the client's, nothing is unsettled:
// a known 0. Anything else is unknown: AMQP shows the head of a queue
// only to whoever takes it (basic.get would take it from the active
// consumer and reorder it), and RabbitMQ shows it through the management
// plugin's HTTP API alone.
func (h holding) laneLag(lane string, q amqp.Queue, exclusive bool) driver.LaneLag {
	l := driver.LaneLag{Lane: lane, Lag: int64(q.Messages) + int64(h.n), Known: true}
	alone := q.Consumers <= h.consumers
	now := time.Now()
	switch {
	case h.n > 0 && !h.untimed && (exclusive || alone):
		l.SetAge(now, h.oldest)
	case h.n == 0 && q.Messages == 0 && alone:
		l.SetAge(now, now)
	}
	return l
}

// queueCounts reads every lane queue's ready messages and consumers; a
// queue it could not read is missing from the result.
func (s *sub) queueCounts(ctx context.Context) map[string]amqp.Queue {
	out := map[string]amqp.Queue{}
	ac, _, err := s.link.get(ctx)
	if err != nil {
		return out
	}
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, l := range s.lanes {
		if ch == nil || ch.IsClosed() {
			if ch, err = ac.Channel(); err != nil {
				ch = nil
				return out
			}
		}
		q, err := ch.QueueDeclarePassive(l.queue, true, false, false, false, nil)
		if err == nil {
			out[l.queue] = q
		}
	}
	return out
}

// held is what the connection's subscribers hold unacknowledged, per
// queue.
func (c *conn) held() map[string]holding {
	out := map[string]holding{}
	for _, s := range c.subs.All() {
		s.mu.Lock()
		for _, l := range s.lanes {
			if l.ch == nil {
				continue
			}
			h := out[l.queue]
			h.consumers++
			h.n += l.held
			for i, done := range l.settled {
				if !done {
					switch t := l.times[i]; {
					case t.IsZero():
						h.untimed = true
					case h.oldest.IsZero() || t.Before(h.oldest):
						h.oldest = t
					}
					break
				}
			}
			out[l.queue] = h
		}
		s.mu.Unlock()
	}
	return out
}

// GroupLag implements driver.GroupLagReader: the depth of each of the
// group's queues (ready messages, plus those this client holds
// unacknowledged) and its age (holding.laneLag), read without joining the
// group, in the layout the server has (readGroup). A group with no queue
// is ErrNotFound; a queue that could not be read is a lane of unknown
// lag.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	queues, partitioned, err := c.readGroup(ctx, topic, group)
	if err != nil {
		return nil, fmt.Errorf("rabbitbus: lag %q group %q: %w", topic, group, err)
	}
	held := c.held()
	out := make([]driver.LaneLag, len(queues))
	for i, q := range queues {
		out[i] = driver.LaneLag{Lane: strconv.Itoa(i)}
		if q != nil {
			out[i] = held[q.Name].laneLag(out[i].Lane, *q, partitioned)
		}
	}
	return out, nil
}

// GroupMembers reports how many members group has: the most consumers
// any of its queues has (every member consumes from the group's queue, or
// from its partition queues), read as GroupLag reads them. A group with
// no queue is ErrNotFound. The CLI's omnibus lag uses it to tell a
// stopped group from a stalled one.
func (c *conn) GroupMembers(ctx context.Context, topic, group string) (int, error) {
	if err := c.checkOpen("members", topic); err != nil {
		return 0, err
	}
	queues, _, err := c.readGroup(ctx, topic, group)
	if err != nil {
		return 0, fmt.Errorf("rabbitbus: members %q group %q: %w", topic, group, err)
	}
	members := 0
	for _, q := range queues {
		if q != nil {
			members = max(members, q.Consumers)
		}
	}
	return members, nil
}

// readGroup reads the queues of group on topic with passive declares,
// one per lane, in the layout the server has rather than the URL's: a
// client with other partitions (or none) reads a group as its members
// made it. The URL's layout comes first: its partition queues (one that
// is missing, or could not be read, is a nil lane), then those past its
// count while the server has them; or the group's one queue. When the
// URL's layout has no queue at all, the other one is read. No queue in
// either is ErrNotFound. partitioned says which layout was read. The
// declares go over the publishing connection, which the server blocks
// during an alarm: they honour ctx.
func (c *conn) readGroup(ctx context.Context, topic, group string) (queues []*amqp.Queue, partitioned bool, err error) {
	ac, _, err := c.pub.get(ctx)
	if err != nil {
		return nil, false, err
	}
	kept := c.kept(topic, group)
	err = c.await(ctx, func() error {
		var ch *amqp.Channel
		defer func() {
			if ch != nil {
				_ = ch.Close()
			}
		}()
		// read is the queue named, or nil; only a channel that cannot
		// be opened is an error.
		read := func(name string) (*amqp.Queue, error) {
			if ch == nil || ch.IsClosed() { // a failed passive declare closes the channel
				var err error
				if ch, err = ac.Channel(); err != nil {
					ch = nil
					return nil, err
				}
			}
			q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				return nil, nil
			}
			return &q, nil
		}
		one := func() error {
			name := groupQueue(topic, group)
			if kept {
				name = topic
			}
			q, err := read(name)
			if q != nil {
				queues, partitioned = []*amqp.Queue{q}, false
			}
			return err
		}
		parts := func(least int) error {
			var qs []*amqp.Queue
			found := false
			for p := range maxPartitions {
				q, err := read(partitionQueue(topic, group, p))
				if err != nil {
					return err
				}
				if q == nil && p >= least {
					break
				}
				found = found || q != nil
				qs = append(qs, q)
			}
			if found {
				queues, partitioned = qs, true
			}
			return nil
		}
		first, second := one, func() error { return parts(0) }
		if c.cfg.partitions > 0 && !kept {
			first, second = func() error { return parts(c.cfg.partitions) }, one
		}
		if err := first(); err != nil || queues != nil {
			return err
		}
		if kept {
			return nil // a dead-letter topic's group is its one queue
		}
		return second()
	})
	if err == nil && queues == nil {
		err = fmt.Errorf("the group has no queue: %w", driver.ErrNotFound)
	}
	return queues, partitioned, err
}

// groupQueues are the queues of group on topic: one, or one per
// partition; a dead-letter topic's own queue for the group named after it.
func (c *conn) groupQueues(topic, group string) []string {
	if c.kept(topic, group) {
		return []string{topic}
	}
	queues := []string{groupQueue(topic, group)}
	if n := c.cfg.partitions; n > 0 {
		queues = make([]string, n)
		for p := range n {
			queues[p] = partitionQueue(topic, group, p)
		}
	}
	return queues
}

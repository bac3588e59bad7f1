package rabbitbus

// Lag: the member's lanes (Lag) and any group's (GroupLag,
// GroupMembers), read with passive queue declares, plus the deliveries
// the connection's subscribers hold unacknowledged, whose oldest gives a
// lane's age. It runs on the caller's goroutine (queueCounts on the
// rebalancer's too); sub.mu guards the held counts and times.

import (
	"context"
	"errors"
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
// unacknowledged) and its age (holding.laneLag), read with passive
// declares, without joining the group. A group whose queue does not exist is ErrNotFound; a queue that
// could not be read is a lane of unknown lag.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	queues := c.groupQueues(topic, group)
	ac, _, err := c.pub.get(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitbus: lag %q group %q: %w", topic, group, err)
	}
	held := c.held()
	out := make([]driver.LaneLag, len(queues))
	// The passive declares go over the publishing connection, which the
	// server blocks during an alarm: they honour ctx.
	err = c.await(ctx, func() error {
		var ch *amqp.Channel
		defer func() {
			if ch != nil {
				_ = ch.Close()
			}
		}()
		for i, q := range queues {
			out[i] = driver.LaneLag{Lane: strconv.Itoa(i)}
			if ch == nil || ch.IsClosed() { // a failed passive declare closes the channel
				var err error
				if ch, err = ac.Channel(); err != nil {
					ch = nil
					continue
				}
			}
			info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			var ae *amqp.Error
			switch {
			case errors.As(err, &ae) && ae.Code == amqp.NotFound && i == 0:
				return fmt.Errorf("group %q has no queue %q: %w", group, q, driver.ErrNotFound)
			case err != nil:
				continue
			}
			out[i] = held[q].laneLag(out[i].Lane, info, len(queues) > 1)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rabbitbus: lag %q: %w", topic, err)
	}
	return out, nil
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

// GroupMembers reports how many members group has: the most consumers
// any of its queues has (every member consumes from the group's queue, or
// from its partition queues), read with passive declares. A group whose
// queue does not exist is ErrNotFound. The CLI's omnibus lag uses it to
// tell a stopped group from a stalled one.
func (c *conn) GroupMembers(ctx context.Context, topic, group string) (int, error) {
	if err := c.checkOpen("members", topic); err != nil {
		return 0, err
	}
	fail := func(err error) (int, error) {
		return 0, fmt.Errorf("rabbitbus: members %q group %q: %w", topic, group, err)
	}
	ac, _, err := c.pub.get(ctx)
	if err != nil {
		return fail(err)
	}
	ch, err := ac.Channel()
	if err != nil {
		return fail(err)
	}
	defer ch.Close()
	members := 0
	for _, q := range c.groupQueues(topic, group) {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fail(fmt.Errorf("no queue %q: %w", q, driver.ErrNotFound))
		}
		if err != nil {
			return fail(err)
		}
		members = max(members, info.Consumers)
	}
	return members, nil
}

package natsbus

// Lag: the member's lanes (Lag) and any group's (GroupLag,
// GroupMembers), read with consumer info requests on the caller's
// goroutine, and each lane's age from the stream's message after the
// consumer's ack floor; sub.mu guards the readers Lag walks, stamps.mu
// the remembered times of those messages.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: num_pending + num_ack_pending of the
// consumer of every lane this member holds. A failed read is Known false.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	s.mu.Lock()
	readers := make([]*reader, 0, len(s.readers))
	for _, r := range s.readers {
		readers = append(readers, r)
	}
	s.mu.Unlock()
	st, _ := s.c.js.Stream(ctx, s.ref.name) // nil: ages unknown
	lags := make([]driver.LaneLag, 0, len(readers))
	for _, r := range readers {
		l := driver.LaneLag{Lane: r.lane}
		if info, err := r.consumer().Info(ctx); err == nil {
			subject := s.topic
			if s.ref.parts > 0 {
				p, _ := strconv.Atoi(r.lane)
				subject = partitionSubject(s.topic, p)
			}
			l = s.c.laneLag(ctx, st, subject, r.lane, info)
		}
		lags = append(lags, l)
	}
	return lags, nil
}

// laneLag is a lane's lag from its consumer's info: the messages pending
// and unacknowledged, the ack floor as Committed, and the age of the
// oldest unacknowledged message: the stream's time of the first message
// on subject after the ack floor (every message up to the floor is
// acknowledged; the next one is not, or the floor would be past it). The
// time is remembered per consumer until the floor moves. With st nil the
// age is unknown.
func (c *conn) laneLag(ctx context.Context, st jetstream.Stream, subject, lane string, info *jetstream.ConsumerInfo) driver.LaneLag {
	now := time.Now()
	floor := info.AckFloor.Stream
	l := driver.LaneLag{Lane: lane, Lag: int64(info.NumPending) + int64(info.NumAckPending), Known: true, Committed: int64(floor)}
	if l.Lag == 0 {
		l.SetAge(now, now)
		return l
	}
	if st == nil {
		return l
	}
	key := stampKey{stream: info.Stream, consumer: info.Name}
	c.stamps.mu.Lock()
	s, ok := c.stamps.at[key]
	c.stamps.mu.Unlock()
	if ok && s.floor == floor {
		l.SetAge(now, s.at)
		return l
	}
	m, err := st.GetMsg(ctx, floor+1, jetstream.WithGetMsgSubject(subject))
	if err != nil {
		return l
	}
	l.SetAge(time.Now(), m.Time)
	c.stamps.mu.Lock()
	if c.stamps.at == nil {
		c.stamps.at = map[stampKey]stamp{}
	}
	c.stamps.at[key] = stamp{floor: floor, at: m.Time}
	c.stamps.mu.Unlock()
	return l
}

// stamps remembers, per consumer, the stream time of the first message
// after its ack floor.
type stamps struct {
	mu sync.Mutex
	at map[stampKey]stamp
}

type stampKey struct{ stream, consumer string }

type stamp struct {
	floor uint64
	at    time.Time
}

// GroupLag implements driver.GroupLagReader: num_pending +
// num_ack_pending of the group's consumer on every lane of topic, read
// with consumer info requests (it does not join the group). An
// unpartitioned topic has one lane, "0"; a partitioned one a lane per
// partition, whose consumer may be missing for a moment while a new
// owner resets it (that lane is then Known false). A missing stream, or a
// group without any consumer, is an error wrapping ErrNotFound.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	if err := checkTopic("lag", topic); err != nil {
		return nil, err
	}
	fail := func(err error) ([]driver.LaneLag, error) {
		return nil, fmt.Errorf("natsbus: lag %q group %q: %w", topic, group, err)
	}
	name := streamName(topic)
	st, err := c.js.Stream(ctx, name)
	if err != nil {
		return fail(classify(err))
	}
	// The layout comes from the stream, whatever this URL's partitions.
	subs := st.CachedInfo().Config.Subjects
	consumers, ok := groupConsumers(topic, group, subs)
	if !ok {
		return fail(fmt.Errorf("stream %q has subjects %v, not an omnibus topic's: %w", name, subs, driver.ErrInvalid))
	}
	lags := make([]driver.LaneLag, len(consumers))
	found := 0
	var firstErr error
	for p, cn := range consumers {
		lane := strconv.Itoa(p)
		lags[p].Lane = lane
		cons, err := c.js.Consumer(ctx, name, cn)
		if err != nil {
			if !errors.Is(err, jetstream.ErrConsumerNotFound) && firstErr == nil {
				firstErr = err
			}
			continue
		}
		found++
		subject := topic
		if cn != safeName(group) {
			subject = partitionSubject(topic, p)
		}
		lags[p] = c.laneLag(ctx, st, subject, lane, cons.CachedInfo())
	}
	if found == 0 {
		if firstErr != nil {
			return fail(classify(firstErr))
		}
		return fail(fmt.Errorf("no consumer for the group on stream %q: %w", name, driver.ErrNotFound))
	}
	return lags, nil
}

// GroupMembers reports how many members group has. On a partitioned
// topic: the live heartbeats in the group's lease bucket (a member's key
// expires lease_ttl after its last refresh). On an unpartitioned one,
// whose pull clients are anonymous, what the group's consumer shows: the
// pull requests waiting (a member with room for messages keeps one
// open), so at least 1 while one waits, 0 when none waits and no
// message is held unacknowledged (no member is pulling or working), and
// an error wrapping ErrUnsupported when it cannot tell (members busy, or
// gone with messages not yet redelivered). The CLI's omnibus lag uses it
// to tell a stopped group from a stalled one.
func (c *conn) GroupMembers(ctx context.Context, topic, group string) (int, error) {
	if err := c.checkOpen("members", topic); err != nil {
		return 0, err
	}
	fail := func(err error) (int, error) {
		return 0, fmt.Errorf("natsbus: members %q group %q: %w", topic, group, err)
	}
	name := streamName(topic)
	st, err := c.js.Stream(ctx, name)
	if err != nil {
		return fail(classify(err))
	}
	if subs := st.CachedInfo().Config.Subjects; len(subs) == 1 && subs[0] == topic {
		cons, err := c.js.Consumer(ctx, name, safeName(group))
		if err != nil {
			return fail(classify(err))
		}
		info := cons.CachedInfo()
		switch {
		case info.NumWaiting > 0:
			return info.NumWaiting, nil
		case info.NumAckPending == 0:
			return 0, nil
		}
		return fail(fmt.Errorf("no pull request waiting, %d message(s) held: members busy or gone: %w", info.NumAckPending, driver.ErrUnsupported))
	}
	kv, err := c.js.KeyValue(ctx, leaseBucket(name, group))
	if err != nil {
		return fail(classify(err))
	}
	keys, err := kv.ListKeysFiltered(ctx, "m.>")
	if err != nil {
		return fail(classify(err))
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	return n, nil
}

package redisbus

// The keeper of an unpartitioned member: every quarter of claim_idle it
// claims again, with XCLAIM JUSTID, the entries the member holds, so
// that no other member claims them while a handler works or they wait
// in the engine; it renews the member's heartbeat, and now and then
// deletes the consumers of members that died once others claimed their
// entries. Close hands back what is still held. sub.mu guards the held
// set.

import (
	"context"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// touchBatch bounds the IDs of one touchScript call.
const touchBatch = 500

// reapEvery is how many keeper rounds pass between two reaps.
const reapEvery = 16

func (s *sub) keepLoop() {
	defer s.wg.Done()
	every := s.c.cfg.claimIdle / 4
	t := time.NewTicker(every)
	defer t.Stop()
	for round := 1; ; round++ {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, every)
		_ = s.Ack(ctx, nil) // what failed before
		s.touch(ctx, 0)
		s.record(ctx, s.lane(unorderedLane))
		if err := s.heartbeat(ctx, s.c.cfg.claimIdle); err != nil && s.ctx.Err() == nil {
			s.c.log.Warn("heartbeat failed", "topic", s.topic, "group", s.group, "err", err)
		}
		if round%reapEvery == 0 {
			s.c.reap(ctx, s.topic, s.group, s.consumer)
		}
		cancel()
	}
}

// touch sets the idle time of the entries the member holds to idle: 0
// keeps them, claim_idle hands them back to the group.
func (s *sub) touch(ctx context.Context, idle time.Duration) {
	s.mu.Lock()
	ids := make([]any, 0, len(s.held))
	for id := range s.held {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for len(ids) > 0 {
		n := min(len(ids), touchBatch)
		args := append([]any{s.group, s.consumer, idle.Milliseconds()}, ids[:n]...)
		if err := touchScript.Run(ctx, s.c.rdb, []string{s.topic}, args...).Err(); err != nil {
			if s.ctx.Err() == nil || idle > 0 {
				s.c.log.Warn("keeping held entries failed", "stream", s.topic, "group", s.group, "err", err)
			}
			return
		}
		ids = ids[n:]
	}
}

// handBack hands the entries the member still holds back to the group:
// their idle time becomes claim_idle, so the next claim of any member
// takes them (Close).
func (s *sub) handBack(ctx context.Context) {
	s.touch(ctx, s.c.cfg.claimIdle)
	s.mu.Lock()
	clear(s.held)
	s.mu.Unlock()
}

// reap deletes the consumers of group on topic's streams that are idle
// for ten times claim_idle with nothing pending, except the caller's
// own.
func (c *conn) reap(ctx context.Context, topic, group, self string) {
	parts, err := c.layout(ctx, topic)
	if err != nil {
		return
	}
	for _, stream := range streamsOf(topic, parts) {
		_ = reapScript.Run(ctx, c.rdb, []string{stream}, group, (10 * c.cfg.claimIdle).Milliseconds(), self).Err()
	}
}

// unhold forgets the IDs of ds (acknowledged).
func (s *sub) unhold(ds []*driver.Delivery) {
	s.mu.Lock()
	for _, d := range ds {
		delete(s.held, d.Position)
	}
	s.mu.Unlock()
}

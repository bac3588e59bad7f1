package rabbitbus

// Lanes: claims, revocations and losses (driver.Lanes). A lane is
// claimed at its channel's first delivery (RabbitMQ 3.10 does not tell a
// consumer it became the single active one) and lost when its channel
// closes, both on the lane's goroutine; in partitioned mode the
// rebalancer goroutine hands the lanes above the member's share over.
// cbMu serializes Claimed and Revoked; Lost is called without it, so
// that it never waits behind another lane's drain.

import (
	"context"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// revoke runs fn, a call of Lanes.Revoked or Lanes.Lost, making a Receive
// in progress return when fn starts and when it ends (see sub.revokes).
func (s *sub) revoke(fn func()) {
	s.bump()
	fn()
	s.bump()
}

// Wake implements driver.Waker: the Receive in progress (or the next)
// returns empty, as when a revocation starts.
func (s *sub) Wake() { s.bump() }

func (s *sub) bump() {
	s.mu.Lock()
	s.revokes++
	s.mu.Unlock()
	driver.Notify(s.wake)
}

// claim announces lane l of channel generation gen, once.
func (s *sub) claim(l *lane, gen uint64) {
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	s.mu.Lock()
	ok := l.gen == gen && l.ch != nil && !l.claimed && !l.revoking && !s.closed
	s.mu.Unlock()
	if !ok {
		return
	}
	s.cb.Claimed([]string{l.id})
	s.mu.Lock()
	if l.gen == gen {
		l.claimed = true
	}
	s.mu.Unlock()
}

// rebalance runs in partitioned mode. Every interval it reads how many
// consumers each partition queue has (each member consumes every one),
// and when this member is active on more than its share, ceil(N/members),
// it hands the extra lanes over: it revokes them (the engine drains and
// acknowledges), closes their channels (the server requeues what was
// left and activates the next consumer in line) and consumes them again,
// now last in line.
func (s *sub) rebalance() {
	defer s.wg.Done()
	t := time.NewTicker(s.c.cfg.rebalance)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.c.cfg.rebalance)
		counts := s.queueCounts(ctx)
		cancel()
		members := 1
		for _, q := range counts {
			members = max(members, q.Consumers)
		}
		share := (len(s.lanes) + members - 1) / members
		s.mu.Lock()
		var active []*lane
		for _, l := range s.lanes {
			if l.claimed && !l.revoking {
				active = append(active, l)
			}
		}
		s.mu.Unlock()
		for i := len(active) - 1; i >= share && s.ctx.Err() == nil; i-- {
			s.handover(active[i])
		}
	}
}

func (s *sub) handover(l *lane) {
	s.cbMu.Lock()
	s.mu.Lock()
	if !l.claimed || l.revoking || s.closed {
		s.mu.Unlock()
		s.cbMu.Unlock()
		return
	}
	l.revoking, l.claimed = true, false
	s.dropLocked(l)
	ch := l.ch
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	s.revoke(func() { s.cb.Revoked(ctx, []string{l.id}) })
	cancel()
	s.cbMu.Unlock()
	if ch != nil {
		_ = ch.Close() // the lane's run loop consumes again
	}
}

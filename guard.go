package omnibus

// Attempts across holders: a message the transport says was delivered
// more than MaxAttempts times without being settled (its handler may
// crash the process each time) is dead-lettered on arrival, without
// running the handler again. On a transport that counts deliveries
// itself (JetStream, RabbitMQ quorum queues) that count is the
// delivery's Attempt. On one that does not (a Kafka partition), the
// driver's driver.AttemptKeeper counts the holders that began a lane's
// committed position, and the engine guards a lane whose first delivery
// was begun before: for guardSpan deliveries it runs the lane's messages
// one at a time, commits the lane up to each and records it with Begin
// before it runs, so that a process that dies leaves its lane's position
// on the message it died in, counted. The guard's state is guarded by
// member.mu; Begin and the commit before it run on the worker, with no
// lock held.

import (
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// guardSpan is how many deliveries of a lane a guard covers. A holder
// that died had handled at most what it received since its last commit
// (CommitInterval) past the committed position: one at a time, the lane's
// next holder gets to the message that killed it, which then stays the
// committed position.
const guardSpan = 256

// guardLocked reports whether d goes to its lane's guard: a delivery a
// previous holder began without settling starts a guard on a transport
// whose driver keeps attempts, and deliveries go to the guard until
// guardSpan went and it has nothing left (so that nothing of a key
// overtakes what of it is still there).
func (m *member) guardLocked(l *lane, d *driver.Delivery) bool {
	if m.keeper == nil {
		return false
	}
	if d.Attempt > 1 && l.guarding == 0 {
		l.guarding = guardSpan
		m.k.logger.Info("a previous holder began this lane's position without settling it; handling the lane one message at a time for a while",
			"member", m.id, "lane", d.Lane, "position", d.Position, "holders", d.Attempt-1)
	}
	if l.guarding > 0 {
		l.guarding--
		return true
	}
	return l.guard != nil && len(l.guard.queue) > 0
}

func (l *lane) guardSlotLocked() *slot {
	if l.guard == nil {
		l.guard = &slot{lane: l, guarded: true}
	}
	return l.guard
}

// begin prepares a guarded entry that no holder's count includes yet:
// the lane's settled work is committed, so that e is the committed
// position, and the keeper records that this holder begins it. One begun
// more than MaxAttempts times is dead-lettered instead of run. When the
// commit or the record fails, e runs all the same (as on a transport
// without a keeper): the count is a safeguard, not a reason to stop.
func (m *member) begin(e *entry) {
	e.begun = true
	l := e.lane
	if err := m.flush(l.ctx, []*lane{l}); err != nil {
		m.k.logger.Warn("commit before a guarded message failed; it runs uncounted", "member", m.id, "lane", l.id, "err", err)
		return
	}
	n, err := m.keeper.Begin(l.ctx, e.d)
	if err != nil {
		m.k.logger.Warn("recording a guarded message's attempt failed; it runs uncounted", "member", m.id, "lane", l.id, "err", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e.base = max(0, n-1)
	if e.base >= m.k.cfg.maxAttempts {
		m.exhaustLocked(e, time.Now())
	}
}

// exhaustLocked marks e, delivered MaxAttempts times or more by holders
// that never settled it, for the dead-letter topic without another run.
func (m *member) exhaustLocked(e *entry, now time.Time) {
	e.dead = true
	e.err = fmt.Errorf("delivered %d times and never settled (MaxAttempts %d): a handler may have crashed its process each time", e.base, m.k.cfg.maxAttempts)
	e.firstFail, e.lastFail = now, now
}

package omnibus

// Attempts across holders: a message delivered more than MaxAttempts
// times by holders that never settled it (its handler may crash the
// process each time) is dead-lettered without running again. On a
// transport that counts deliveries (JetStream, RabbitMQ quorum queues)
// the count is the delivery's Attempt; on one that does not (a Kafka
// partition), the driver's driver.AttemptKeeper counts the holders that
// began a lane's committed position.
//
// A count of deliveries also counts the messages a crashed process held
// and never ran, and a position begun by a process that another
// message's crash killed. So a delivery a previous holder took without
// settling puts its lane under guard for guardSpan deliveries: the
// lane's messages run one at a time, and one guarded message at a time
// in the member; before each runs, what the lane settled is acknowledged
// or committed and, with a keeper, the message is recorded with Begin.
// A crash then leaves unsettled only what crashed and what it held back
// (its key's later messages, deliveries not run yet). The first guarded
// message found exhausted is dead-lettered; the others of the guard run,
// as their counts came from the process it killed. Messages after it in
// delivery order get their counts raised with it, and are forgiven that
// way; a second poisoned message among them costs one more crash.
//
// The guard's state is guarded by member.mu; the turn (guardTurn) is held
// by the worker running a guarded message; settling and Begin run on
// that worker with no lock held.

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

// guardLocked reports whether d goes to its lane's guard. A delivery
// that a previous holder took without settling starts a guard: one the
// driver says was Redelivered, or whose Attempt is above 1 where that
// means the same (a claim's position begun before, with a keeper; a
// transport's count, where the engine does not nack retries, which come
// back counted too). Deliveries go to the guard until guardSpan went and
// it has nothing left (so that nothing of a key overtakes what of it is
// still there).
func (m *member) guardLocked(l *lane, d *driver.Delivery) bool {
	suspect := d.Redelivered || d.Attempt > 1 && (m.keeper != nil || m.nacker == nil)
	if suspect && l.guarding == 0 {
		l.guarding, l.forgiving = guardSpan, false
		m.k.logger.Info("a previous holder took this lane's message without settling it; handling the lane one message at a time for a while",
			"member", m.id, "lane", d.Lane, "position", d.Position, "attempt", d.Attempt)
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

// begin prepares a guarded entry whose turn came (the member runs one
// guarded message at a time): the lane's settled work is acknowledged or
// committed first, so that a crash now leaves only e unsettled; where the
// driver keeps attempts, e is the committed position and the keeper
// records that this holder begins it. One begun (or delivered) more than
// MaxAttempts times is dead-lettered instead of run, unless the guard
// already dead-lettered one: the process the others were held in died
// while that one ran, so their counts are not theirs, and they run. When
// the commit or the record fails, e runs all the same (as on a transport
// without a keeper): the count is a safeguard, not a reason to stop.
func (m *member) begin(e *entry) {
	l := e.lane
	if err := m.flush(l.ctx, []*lane{l}); err != nil {
		m.k.logger.Warn("settling before a guarded message failed; it runs uncounted", "member", m.id, "lane", l.id, "err", err)
		return
	}
	if m.keeper != nil && !e.begun {
		e.begun = true
		n, err := m.keeper.Begin(l.ctx, e.d)
		if err != nil {
			m.k.logger.Warn("recording a guarded message's attempt failed; it runs uncounted", "member", m.id, "lane", l.id, "err", err)
			return
		}
		m.mu.Lock()
		e.base = max(0, n-1)
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.attempts > 0 || e.base < m.k.cfg.maxAttempts {
		return
	}
	if l.forgiving {
		e.base = 0
		return
	}
	l.forgiving = true
	m.exhaustLocked(e, time.Now())
}

// release hands what s holds back to the transport without running it:
// its lane is going while the batch waited for its turn.
func (m *member) release(s *slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range s.queue {
		m.forgetLocked(e)
	}
	s.queue, s.running = nil, 0
	s.active = false
	s.lane.dropSlotLocked(s)
}

// exhaustLocked marks e, delivered MaxAttempts times or more by holders
// that never settled it, for the dead-letter topic without another run.
func (m *member) exhaustLocked(e *entry, now time.Time) {
	e.dead = true
	e.err = fmt.Errorf("delivered %d times and never settled (MaxAttempts %d): a handler may have crashed its process each time", e.base, m.k.cfg.maxAttempts)
	e.firstFail, e.lastFail = now, now
}

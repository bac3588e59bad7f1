package omnibus

// Attempts across holders: a message delivered more than MaxAttempts
// times by holders that never settled it (its handler may crash the
// process each time) is dead-lettered without running again. On a
// transport that counts deliveries (JetStream, RabbitMQ quorum queues)
// the count is the delivery's Attempt; on one that does not (a Kafka
// partition), the driver's driver.AttemptKeeper counts the holders that
// began a lane's committed position.
//
// A delivery count also counts the messages a crashed process held and
// never ran. So a suspect (a delivery the driver says was Redelivered, or
// whose Attempt is above 1: a previous holder may have died running it)
// waits for the member's turn, runs alone among the member's suspects,
// and only after what the member settled was acknowledged or committed:
// a crash while it runs leaves it, and what it held back, unsettled,
// while suspects before it in delivery order were settled. The first
// suspect found exhausted is dead-lettered; the suspects held with it
// then run whatever their counts say (the process they were held in died
// while it ran), until the member holds none. A second poisoned message
// among them costs one more crash.
//
// A delivery count that also counts holders that never ran the message
// (JetStream counts a message a crashed process had received and held
// behind the poisoned one, and a pull it answers after its client died)
// would dead-letter such a message with the poisoned one. A driver whose
// count does that keeps its own count of the holders that ran each
// redelivered message (driver.RunCounter), and a suspect's count is
// that one, recorded when its turn comes.
//
// On a transport with a keeper, where only a claim's first delivery is
// counted, a suspect puts its lane under guard for guardSpan deliveries:
// the lane's messages are all suspects, one at a time, each committed up
// to and recorded with Begin before it runs, so that a process that dies
// leaves its lane's position on the message it died in, counted.
//
// The suspects' state is guarded by member.mu; the turn (guardTurn) is
// held by the worker running a suspect; settling and Begin run on that
// worker with no lock held.

import (
	"context"
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

// guardLocked reports whether d goes to its lane's guard: on a transport
// with a keeper, a delivery whose Attempt is above 1 (a claim's position
// begun before) starts a guard, and deliveries go to it until guardSpan
// went and it has nothing left (so that nothing of a key overtakes what
// of it is still there).
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

// unguardLocked ends the guard of s's lane when the dead letter at the
// head of its guard slot s did not land: it holds its key, as anywhere
// else, not the lane. s keeps it and what of its key came after it; the
// lane's other messages go to their keys' slots (their own, unordered)
// and run as ordinary deliveries: the lane's position cannot pass the
// dead letter until it lands, so a crash among them could not be pinned
// on the message that caused it anyway.
func (m *member) unguardLocked(s *slot) {
	l := s.lane
	l.guarding = 0
	if l.guard == s {
		l.guard = nil
	}
	s.guarded = false
	unordered := m.k.cfg.ordering == OrderNone
	s.loose = unordered
	s.key = m.slotKey(s.queue[0].d.Key)
	if !unordered && l.slots[s.key] == nil {
		l.slots[s.key] = s
	}
	stay := s.queue[:1]
	for _, e := range s.queue[1:] {
		if e.suspect {
			e.suspect = false
			if m.suspects--; m.suspects == 0 {
				m.forgiving = false
			}
		}
		e.begun = true // nothing records it: the guard's count is over
		k := m.slotKey(e.d.Key)
		if !unordered && k == s.key {
			stay = append(stay, e)
			continue
		}
		var to *slot
		if unordered {
			to = &slot{lane: l, loose: true, running: 1, one: [1]*entry{e}}
			to.queue = to.one[:]
		} else if to = l.slots[k]; to == nil {
			to = &slot{lane: l, key: k}
			l.slots[k] = to
			to.queue = append(to.one[:0], e)
		} else {
			to.queue = append(to.queue, e)
		}
		m.joinedLocked(to)
	}
	clear(s.queue[len(stay):])
	s.queue = stay
}

// begin prepares a suspect whose turn came: what the member settled is
// acknowledged or committed first, so that a crash now leaves only e (and
// what it holds back) unsettled; with a keeper, e is the committed
// position and the keeper records that this holder begins it. One
// delivered or begun more than MaxAttempts times is dead-lettered
// instead of run, unless the member already found one so while holding
// e (see the file's comment). When settling or the record fails, e runs
// all the same, uncounted: the count is a safeguard, not a reason to
// stop.
func (m *member) begin(e *entry) {
	l := e.lane
	// Every lane: a crash now must leave unsettled only e and what it
	// holds back, not what other lanes' suspects settled before it.
	if err := m.flush(l.ctx, nil); err != nil {
		m.k.logger.Warn("settling before a suspect failed; it runs uncounted", "member", m.id, "lane", l.id, "err", err)
		return
	}
	if count := m.counting(e); count != nil {
		e.begun = true
		n, err := count(l.ctx, e.d)
		if err != nil {
			m.k.logger.Warn("recording a suspect's attempt failed; it runs uncounted", "member", m.id, "lane", l.id, "err", err)
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
	if m.forgiving {
		m.k.logger.Info("running a message delivered with an exhausted one, whatever its count", "member", m.id, "lane", l.id, "id", e.msg.ID, "count", e.base)
		e.base = 0
		return
	}
	m.forgiving = true
	m.exhaustLocked(e, time.Now())
}

// counting returns what records that this holder begins e, a suspect
// whose turn came, and counts the holders that did; nil when the
// delivery's Attempt stands: recorded already, or counted by the
// transport alone.
func (m *member) counting(e *entry) func(context.Context, *driver.Delivery) (int, error) {
	switch {
	case e.begun:
		return nil
	case m.keeper != nil:
		return m.keeper.Begin
	case m.counter != nil && e.d.Attempt > 1:
		return m.counter.CountRun
	}
	return nil
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

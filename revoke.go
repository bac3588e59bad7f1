package omnibus

// Lanes: the driver's claims, revocations and losses (driver.Lanes). A
// revoked lane drains (its work finishes within DrainTimeout), commits and
// goes; a lost one goes at once. Meanwhile the fetch loop goes on for the
// lanes that stay. The lanes' state is guarded by member.mu; Revoked takes
// commitMu for its final commit.

import (
	"context"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Claimed implements driver.Lanes.
func (m *member) Claimed(ids []string) {
	m.mu.Lock()
	for _, id := range ids {
		if l := m.lanes[id]; l != nil && (l.gone || l.revoking) {
			delete(m.lanes, id)
		}
		m.laneLocked(id)
	}
	m.lanesChangedLocked()
	m.mu.Unlock()
	m.emit(Event{Kind: EventClaimed, Lanes: ids})
}

// Revoked implements driver.Lanes. It waits for a Receive in progress to
// return and be dispatched (so nothing of the old claim arrives later),
// lets the lanes' work finish within DrainTimeout (retries included),
// commits what is settled, and lets the lanes go. Meanwhile the fetch
// loop goes on for the lanes that stay, and drops what arrives for these.
func (m *member) Revoked(ctx context.Context, ids []string) {
	// One bound for the whole drain: the wait for Receive and for the
	// lanes' work share it.
	drain, cancel := context.WithTimeout(ctx, m.k.cfg.drainTimeout)
	defer cancel()
	m.awaitReceive(drain)

	m.mu.Lock()
	var lanes []*lane
	var idle []chan struct{}
	for _, id := range ids {
		l := m.lanes[id]
		if l == nil || l.gone || l.revoking {
			continue
		}
		m.revokeLocked(l)
		if l.inflight > 0 {
			l.idle = make(chan struct{})
			idle = append(idle, l.idle)
		}
		lanes = append(lanes, l)
	}
	m.markedLocked()
	m.mu.Unlock()
wait:
	for _, ch := range idle {
		select {
		case <-ch:
		case <-drain.Done():
			break wait
		}
	}
	_ = m.flush(ctx, lanes)
	m.mu.Lock()
	for _, l := range lanes {
		m.goneLocked(l)
	}
	m.mu.Unlock()
	m.emit(Event{Kind: EventRevoked, Lanes: ids})
}

// Lost implements driver.Lanes: abandon the lanes without committing. It
// may come while a Revoked of other lanes drains.
func (m *member) Lost(ids []string) {
	wait, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	m.awaitReceive(wait)
	m.mu.Lock()
	for _, id := range ids {
		if l := m.lanes[id]; l != nil {
			m.revokeLocked(l)
			m.goneLocked(l)
		}
	}
	m.markedLocked()
	m.mu.Unlock()
	m.emit(Event{Kind: EventLost, Lanes: ids})
}

// awaitReceive waits, at most until ctx ends, for an outstanding Receive
// to return and its deliveries to be dispatched. It wakes that Receive
// (driver.Waker) once no other can start: a driver that woke Receive
// itself before calling Revoked or Lost may have woken the one before,
// and the fetch loop may have started this one since, which would
// otherwise wait for a message (on an idle topic, until ctx ends).
//
// From then until the caller has marked its lanes (markedLocked), the
// fetch loop starts no Receive: one started in between would carry the
// epoch from before the marking, and its deliveries of these lanes would
// be dropped as the old claim's even when they are a new claim's (a lane
// lost and claimed again by this member while that Receive waits), which
// the driver, having handed them over, would not deliver again.
func (m *member) awaitReceive(ctx context.Context) {
	m.mu.Lock()
	if m.marking == 0 {
		m.marked = make(chan struct{})
	}
	m.marking++
	received := m.receiving
	m.mu.Unlock()
	if received != nil {
		if m.waker != nil {
			m.waker.Wake()
		}
		select {
		case <-received:
		case <-ctx.Done():
		}
	}
}

// markedLocked ends what awaitReceive began: the caller's lanes are
// marked, and the fetch loop may start a Receive again.
func (m *member) markedLocked() {
	if m.marking--; m.marking == 0 {
		close(m.marked)
	}
}

// revokeLocked marks l as going away: deliveries of it still to come
// (from a Receive that started earlier, or while it drains) are dropped.
func (m *member) revokeLocked(l *lane) {
	l.revoking = true
	m.epoch++
	m.revokedAt[l.id] = m.epoch
	m.lanesChangedLocked()
}

// lanesChangedLocked lets the fetch loop ask again at once: a Receive
// that returned nothing because lanes changed is not a sign that the
// first message waiting does not fit (see fullWait).
func (m *member) lanesChangedLocked() {
	m.laneGen++
	m.full = false
	m.wakeFetchLocked()
}

// goneLocked detaches l: results still running on it are discarded.
func (m *member) goneLocked(l *lane) {
	m.dropQueuedLocked(l)
	l.gone = true
	l.cancel()
	m.pending -= l.held
	l.held = 0
	l.head, l.tail, l.mark = nil, nil, nil
	if l.idle != nil { // a Revoked of l waits for it
		close(l.idle)
		l.idle = nil
	}
	if m.lanes[l.id] == l {
		delete(m.lanes, l.id)
	}
	m.lanesChangedLocked()
}

// dropQueuedLocked releases every entry of l that is not running: queued
// behind a running one, waiting for a batch, or waiting for a retry.
func (m *member) dropQueuedLocked(l *lane) {
	drop := func(s *slot) {
		m.unparkLocked(s)
		for _, e := range s.queue[s.running:] {
			m.forgetLocked(e)
		}
		clear(s.queue[s.running:])
		s.queue = s.queue[:s.running]
		if s.timer != nil && s.timer.Stop() {
			s.timer = nil
			s.active = false
			l.dropSlotLocked(s)
			m.wg.Done() // the timer will not fire
		}
		if s.wake != nil {
			driver.Notify(s.wake)
		}
	}
	for _, s := range l.slots {
		drop(s)
	}
	for s := range l.loose {
		drop(s)
	}
	if l.guard != nil {
		drop(l.guard)
	}
}

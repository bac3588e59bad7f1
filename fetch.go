package omnibus

// Fetching: the fetch loop asks Receive for what fits in the member's
// room and dispatches each delivery into its lane's slot. The loop owns
// the calls to Receive; the state it reads and writes is guarded by
// member.mu.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// holdFactor bounds the unsettled entries a member holds at holdFactor x
// MaxInFlight: entries parked behind a retry do not count against
// MaxInFlight, so that one failing key does not stop the others, but they
// cannot grow without bound either.
const holdFactor = 16

// minWatermark is the least number of entries a member keeps for its
// lanes' watermarks (on logs), settled ones included: a settled entry
// behind an unsettled one keeps only its position (a few hundred bytes),
// so a poison message holds its lane's commit back while other keys run
// for this long before the member waits for it.
const minWatermark = 1 << 16

// maxWatermark is the bound on entries held for watermarks.
func (c *consumerConfig) maxWatermark() int { return max(holdFactor*c.maxInFlight, minWatermark) }

// room is what the fetch loop may ask Receive for now: the bounds on
// messages and bytes in flight less what is held. Entries parked until a
// retry count against the bytes and the hold bound, not against
// MaxInFlight. Once messages are active it waits until a quarter of the
// bound is free (judged at the average size received so far), so that
// Receive returns batches rather than one message per settlement.
func (m *member) room() driver.Room {
	cfg := &m.k.cfg
	hold, marks := holdFactor*cfg.maxInFlight, cfg.maxWatermark()
	if m.full || m.bytes >= cfg.maxBytes || m.inflight >= hold || m.pending >= marks {
		return driver.Room{}
	}
	active := m.inflight - m.waiting
	r := driver.Room{
		Count:    min(cfg.maxInFlight-active, hold-m.inflight, marks-m.pending),
		Bytes:    cfg.maxBytes - m.bytes,
		Oversize: m.inflight == 0,
	}
	if r.Count <= 0 {
		return driver.Room{}
	}
	if active > 0 && m.avgSize > 0 {
		limit := max(1, min(cfg.maxInFlight, cfg.maxBytes/m.avgSize))
		if min(r.Count, r.Bytes/m.avgSize) < max(1, limit/4) {
			return driver.Room{}
		}
	}
	return r
}

// fullWait is how long the fetch loop waits before asking again after a
// Receive that returned nothing while messages were in flight (the first
// message waiting may not fit), unless a settlement wakes it first.
const fullWait = 50 * time.Millisecond

func (m *member) fetchLoop(ctx context.Context) {
	defer close(m.fetchDone)
	failures := 0
	for {
		m.mu.Lock()
		for m.marking > 0 { // a revocation or loss marks its lanes (see awaitReceive)
			marked := m.marked
			m.mu.Unlock()
			select {
			case <-marked:
			case <-ctx.Done():
				return
			}
			m.mu.Lock()
		}
		room := m.room()
		epoch, gen := m.epoch, m.laneGen
		var received chan struct{}
		if room.Count > 0 {
			received = make(chan struct{})
			m.receiving = received
		}
		if room.Count <= 0 && !m.fetchIdle && m.k.batch != nil {
			m.wakeBatchesLocked() // nothing more comes until some settle
		}
		m.fetchIdle = room.Count <= 0
		full := m.full
		m.mu.Unlock()
		if room.Count <= 0 {
			var retry *time.Timer
			var expired <-chan time.Time
			if full {
				retry = time.NewTimer(fullWait)
				expired = retry.C
			}
			select {
			case <-m.roomCh:
			case <-expired:
			case <-ctx.Done():
				return
			}
			if retry != nil {
				retry.Stop()
			}
			m.mu.Lock()
			m.full = false
			m.mu.Unlock()
			continue
		}
		began := time.Now()
		ds, err := m.sub.Receive(ctx, room)
		if err != nil {
			m.mu.Lock()
			m.receiving = nil
			m.mu.Unlock()
			close(received)
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			if errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnsupported) || errors.Is(err, ErrInvalid) {
				m.k.fail(fmt.Errorf("omnibus: receive %q: %w", m.k.topic, err))
				return
			}
			failures++
			delay := m.k.cfg.backoff(failures)
			m.k.logger.Warn("receive failed, retrying", "member", m.id, "err", err, "delay", delay)
			select {
			case <-time.After(delay):
				continue
			case <-ctx.Done():
				return
			}
		}
		failures = 0
		now := time.Now()
		fetched := 0 // bytes, for fetch hooks
		m.mu.Lock()
		for _, d := range ds {
			if len(m.k.hooks.fetch) > 0 {
				fetched += d.Size()
			}
			// A Receive that outlived a revocation's wait for it may hold
			// deliveries of the old claim: the lane's next owner reads
			// them again.
			if m.revokedAt[d.Lane] <= epoch {
				m.dispatchLocked(d, now)
			}
		}
		m.full = len(ds) == 0 && m.inflight > 0 && m.laneGen == gen
		m.receiving = nil
		m.mu.Unlock()
		close(received)
		if hs := m.k.hooks.fetch; len(hs) > 0 && len(ds) > 0 {
			info := FetchInfo{Topic: m.k.topic, Group: m.k.cfg.group, Member: m.id, Count: len(ds), Bytes: fetched, Took: now.Sub(began)}
			for _, h := range hs {
				h.OnFetch(info)
			}
		}
	}
}

// wakeFetchLocked wakes the fetch loop when it waits and there is room.
func (m *member) wakeFetchLocked() {
	if m.fetchIdle && m.room().Count > 0 {
		m.fetchIdle = false
		driver.Notify(m.roomCh)
	}
}

func (m *member) laneLocked(id string) *lane {
	l := m.lanes[id]
	if l == nil {
		ctx, cancel := context.WithCancel(m.ctx)
		l = &lane{id: id, ctx: ctx, cancel: cancel, slots: map[string]*slot{}, loose: map[*slot]struct{}{}, settled: m.k.laneCounter(id)}
		m.lanes[id] = l
	}
	return l
}

func (m *member) dispatchLocked(d *driver.Delivery, now time.Time) {
	l := m.laneLocked(d.Lane)
	if l.gone || l.revoking {
		return // the lane is going away; its next owner reads it again
	}
	guarded := m.guardLocked(l, d)
	// An unordered message without batching gets a slot of its own,
	// allocated with its entry, already holding it: its worker starts
	// without taking the lock again.
	loose := m.k.cfg.ordering == OrderNone && m.k.batch == nil && !guarded
	var e *entry
	var s *slot
	if loose {
		p := new(struct {
			s slot
			e entry
		})
		s, e = &p.s, &p.e
		*s = slot{lane: l, loose: true, running: 1, one: [1]*entry{e}}
		s.queue = s.one[:]
	} else if guarded {
		s, e = l.guardSlotLocked(), new(entry)
	} else if s = m.slotForLocked(l, d.Key); s == nil {
		// A key without a slot gets one allocated with its entry, its
		// queue in the slot itself: one allocation for a new key.
		p := new(struct {
			s slot
			e entry
		})
		s, e = &p.s, &p.e
		key := m.slotKey(d.Key)
		*s = slot{lane: l, key: key}
		s.queue = s.one[:0]
		l.slots[key] = s
	} else {
		e = new(entry)
	}
	e.d, e.lane, e.arrived = d, l, now
	if d.Attempt > 1 {
		e.base = d.Attempt - 1
	}
	e.begun = d.Attempt == 1 // a keeper recorded a claim it counts as 1; a first delivery is not counted (see guard.go)
	if e.suspect = guarded || d.Redelivered || d.Attempt > 1; e.suspect {
		m.suspects++ // judged when its turn comes
	}
	fromDelivery(&e.msg, m.k.topic, d)
	e.size = d.Size()
	l.inflight++
	m.inflight++
	m.bytes += e.size
	if m.avgSize == 0 {
		m.avgSize = max(1, e.size)
	} else {
		m.avgSize = max(1, (7*m.avgSize+e.size)/8)
	}
	if m.committer != nil {
		if l.tail == nil {
			l.head = e
		} else {
			l.tail.next = e
		}
		l.tail = e
		l.held++
		m.pending++
	}
	if !loose {
		s.queue = append(s.queue, e)
	}
	m.joinedLocked(s)
}

// joinedLocked sees to s after an entry joined its queue: an idle slot
// goes to the run queue; a parked one counts it as waiting; a batch
// waiting to fill looks again.
func (m *member) joinedLocked(s *slot) {
	switch {
	case !s.active:
		s.active = true
		m.startLocked(s)
	case s.parked:
		m.waiting++
	case s.wake != nil:
		driver.Notify(s.wake)
	}
}

// slotForLocked returns the slot a delivery of key joins in the member's
// ordering (one per key in key mode, one per lane in lane mode), or nil
// when there is none yet.
func (m *member) slotForLocked(l *lane, key string) *slot {
	return l.slots[m.slotKey(key)]
}

// slotKey is the key of the slot a delivery of key joins: key itself in
// key mode, "" (the lane's one slot) otherwise.
func (m *member) slotKey(key string) string {
	if m.k.cfg.ordering != OrderKey {
		return ""
	}
	return key
}

func (l *lane) dropSlotLocked(s *slot) {
	switch {
	case s.loose:
		delete(l.loose, s)
	case s.guarded:
		if l.guard == s {
			l.guard = nil
		}
	case l.slots[s.key] == s:
		delete(l.slots, s.key)
	}
}

package omnibus

// Settlement: the in-flight accounting, the watermark of each lane (on
// logs: the highest delivery below which every one is settled) and the
// settle loop, which sends acknowledgements and commits. The accounting
// and the watermark are guarded by member.mu; commitMu serializes flushes
// with a revocation's final commit, so nothing is committed for a lane
// after it is gone.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// forgetLocked drops e from the in-flight accounting. Settled or not, the
// engine is done with it; an unsettled one is delivered again later.
func (m *member) forgetLocked(e *entry) {
	l := e.lane
	if e.suspect {
		e.suspect = false
		if m.suspects--; m.suspects == 0 {
			m.forgiving = false
		}
	}
	l.inflight--
	m.inflight--
	m.bytes -= e.size
	e.msg.Body, e.d.Body = nil, nil
	m.full = false
	m.wakeFetchLocked()
	if l.idle != nil && l.inflight == 0 {
		close(l.idle)
		l.idle = nil
	}
	if m.drained != nil && m.inflight == 0 {
		close(m.drained)
		m.drained = nil
	}
}

// ackLocked settles e.
func (m *member) ackLocked(e *entry) {
	m.forgetLocked(e)
	l := e.lane
	if l.gone {
		return
	}
	m.processed.Add(1)
	if m.committer == nil {
		l.settled.Add(1)
		m.acks = append(m.acks, e.d)
		if len(m.acks) == 1 { // the settle loop takes them all at once
			driver.Notify(m.settleCh)
		}
		return
	}
	// Held only for its position now: drop the rest, so that entries
	// behind an unsettled one cost little (see minWatermark).
	e.settled = true
	e.msg = Message{}
	e.d.Message = driver.Message{}
	advanced := false
	for l.head != nil && l.head.settled {
		l.settled.Add(1)
		l.mark = l.head.d
		l.head = l.head.next
		l.held--
		m.pending--
		advanced = true
	}
	if l.head == nil {
		l.tail = nil
	}
	if advanced {
		m.wakeFetchLocked() // the watermark bound may have held it
		driver.Notify(m.settleCh)
	}
}

// settleLoop sends acknowledgements as they come, coalesced, and commits
// positions at most once per CommitInterval: acknowledgements free the
// transport's prefetch window, commits only bound redelivery after a crash.
func (m *member) settleLoop() {
	defer close(m.settleDone)
	for {
		select {
		case <-m.settleCh:
			_ = m.flush(m.ctx, nil)
		case <-m.settleStop:
			return
		}
		if m.committer == nil {
			continue
		}
		t := time.NewTimer(m.k.cfg.commitInterval)
		select {
		case <-t.C:
		case <-m.settleStop:
			t.Stop()
			return
		}
	}
}

// flush sends pending acknowledgements and commits the watermark of the
// given lanes (all lanes when nil); it returns the commit's error. Lanes
// already gone are never committed: commitMu keeps a revocation from
// overtaking a flush. Failures are logged; a failed commit is tried again
// with the next flush. Events are emitted after commitMu is released.
func (m *member) flush(ctx context.Context, only []*lane) error {
	events, err := m.flushLocked(ctx, only)
	for _, e := range events {
		m.emit(e)
	}
	return err
}

func (m *member) flushLocked(ctx context.Context, only []*lane) ([]Event, error) {
	m.commitMu.Lock()
	defer m.commitMu.Unlock()
	m.mu.Lock()
	acks := m.acks
	m.acks = nil
	var marks []*driver.Delivery
	var lanes []string
	collect := func(l *lane) {
		if l.mark != nil && !l.gone {
			marks = append(marks, l.mark)
			lanes = append(lanes, l.id)
			l.mark = nil
		}
	}
	if only != nil {
		for _, l := range only {
			collect(l)
		}
	} else {
		for _, l := range m.lanes {
			collect(l)
		}
	}
	m.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, m.k.cfg.commitTimeout)
	defer cancel()
	var events []Event
	var errs []error
	if len(acks) > 0 {
		if err := m.acker.Ack(ctx, acks); err != nil {
			m.k.logger.Warn("ack failed; the transport will redeliver", "member", m.id, "count", len(acks), "err", err)
			errs = append(errs, fmt.Errorf("omnibus: ack %d message(s) of %q: %w", len(acks), m.k.topic, err))
		} else {
			events = append(events, Event{Kind: EventAcked, Count: len(acks)})
		}
	}
	if len(marks) > 0 {
		if err := m.committer.Commit(ctx, marks); err != nil {
			m.k.logger.Warn("commit failed; will retry with the next", "member", m.id, "lanes", lanes, "err", err)
			errs = append(errs, fmt.Errorf("omnibus: commit %q lanes %v: %w", m.k.topic, lanes, err))
			m.mu.Lock()
			for i, d := range marks {
				if l := m.lanes[lanes[i]]; l != nil && l.mark == nil && !l.gone {
					l.mark = d
				}
			}
			m.mu.Unlock()
		} else {
			events = append(events, Event{Kind: EventCommitted, Lanes: lanes, Count: len(marks)})
		}
	}
	return events, errors.Join(errs...)
}

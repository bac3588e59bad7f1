package omnibus

// Outcomes: what happens to a handled batch. Successes are settled (see
// watermark.go); failures are retried after a backoff, in place (the slot
// parks on a timer) or through the transport's Nack; permanent failures
// and exhausted attempts are dead-lettered first and settled after. The
// slots' queues and the parked count are guarded by member.mu; dead
// letters and nacks are sent with no lock held.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Dead-letter headers the engine adds to a message it dead-letters.
const (
	HeaderDeadReason       = "omnibus-dead-reason"
	HeaderDeadAttempts     = "omnibus-dead-attempts"
	HeaderDeadTopic        = "omnibus-dead-topic"
	HeaderDeadGroup        = "omnibus-dead-group"
	HeaderDeadLane         = "omnibus-dead-lane"
	HeaderDeadPosition     = "omnibus-dead-position"
	HeaderDeadFirstFailure = "omnibus-dead-first-failure"
	HeaderDeadLastFailure  = "omnibus-dead-last-failure"
)

// settle applies the outcomes of a handled batch. It returns false when
// the worker must leave s (a retry timer or nothing owns the slot now).
//
// Events are collected and emitted once m.mu is released: an observer may
// call back into the consumer.
func (m *member) settle(s *slot, batch []*entry, latency time.Duration) bool {
	cfg := &m.k.cfg
	l := s.lane
	var failed, dead []*entry
	for _, e := range batch {
		switch {
		case e.dead:
			dead = append(dead, e)
		case e.err == nil:
			m.emit(Event{Kind: EventProcessed, Lane: e.d.Lane, Message: &e.msg, Latency: latency})
		default:
			now := time.Now()
			if e.firstFail.IsZero() {
				e.firstFail = now
			}
			e.lastFail = now
			m.emit(Event{Kind: EventFailed, Lane: e.d.Lane, Message: &e.msg, Err: e.err, Latency: latency})
			if IsPermanent(e.err) || e.base+e.attempts >= cfg.maxAttempts {
				e.dead = true
				dead = append(dead, e)
			} else {
				failed = append(failed, e)
			}
		}
	}
	// Dead letters are published before they are settled: a message is
	// never settled without landing somewhere. One that did not land
	// stays at the head of its slot and is published again after a
	// backoff; the slot's other messages wait behind it, other slots run.
	var parked []*entry
	for _, e := range dead {
		if err := m.deadLetter(l.ctx, e); err != nil {
			parked = append(parked, e)
		}
	}
	var nacked []*entry
	// A lane going away (or a member closing) releases its failures to
	// the transport below, unsettled: no retry copy is made then.
	if len(failed) > 0 && m.nacker != nil && failed[0].d.Attempt > 0 && l.ctx.Err() == nil {
		nacked, failed = m.nack(failed)
	}

	var retried []Event
	m.mu.Lock()
	var keep []*entry
	for _, e := range batch {
		switch {
		case contains(failed, e) || contains(parked, e):
			keep = append(keep, e)
		case contains(nacked, e):
			m.forgetLocked(e)
		default:
			m.ackLocked(e)
		}
	}
	// The handled batch leaves the queue; entries to retry go back to its
	// head in their order, in place.
	n, k := len(batch), len(keep)
	clear(s.queue[:n-k])
	copy(s.queue[n-k:n], keep)
	s.queue = s.queue[n-k:]
	s.running = 0
	switch {
	case k == 0 && s.loose: // its one message is done: no need to look again
		s.active = false
		l.dropSlotLocked(s)
		m.mu.Unlock()
		return false
	case k == 0:
		m.mu.Unlock()
		return true
	case l.gone || m.ctx.Err() != nil:
		// Not retried here: release the slot's work to the transport.
		for _, e := range s.queue {
			m.forgetLocked(e)
		}
		s.queue = nil
		m.mu.Unlock()
		return true
	}
	var unguarded *entry
	if s.guarded && len(parked) > 0 {
		m.unguardLocked(s)
		unguarded = s.queue[0]
	}
	var delay time.Duration
	if keep[0].dead {
		delay = cfg.backoff(keep[0].deadTries)
	} else {
		delay = cfg.backoff(keep[0].attempts)
	}
	for _, e := range keep {
		if !e.dead {
			retried = append(retried, Event{Kind: EventRetried, Lane: e.d.Lane, Message: &e.msg, Delay: delay})
		}
	}
	if s.loose {
		l.loose[s] = struct{}{} // for a revocation to find it
	}
	m.parkLocked(s, delay)
	m.mu.Unlock()
	if unguarded != nil {
		m.k.logger.Info("a dead letter that does not land holds its key only: the lane's guard ends", "member", m.id, "lane", l.id, "id", unguarded.msg.ID)
	}
	for _, e := range retried {
		m.emit(e)
	}
	return false
}

// parkLocked queues s again after delay. Meanwhile its entries count as
// waiting, not against MaxInFlight, so the fetch loop goes on for the
// other slots.
func (m *member) parkLocked(s *slot, delay time.Duration) {
	s.parked = true
	m.waiting += len(s.queue)
	m.wakeFetchLocked()
	m.wg.Add(1)
	s.timer = time.AfterFunc(delay, func() {
		defer m.wg.Done()
		m.mu.Lock()
		s.timer = nil
		m.unparkLocked(s)
		m.startLocked(s)
		m.mu.Unlock()
	})
}

func (m *member) unparkLocked(s *slot) {
	if s.parked {
		s.parked = false
		m.waiting -= len(s.queue)
	}
}

func contains(es []*entry, e *entry) bool {
	for _, x := range es {
		if x == e {
			return true
		}
	}
	return false
}

// nack hands failed entries back to the transport for delayed
// redelivery. It returns those the transport took and those it did not,
// which the engine retries itself.
func (m *member) nack(failed []*entry) (nacked, rest []*entry) {
	ds := make([]*driver.Delivery, len(failed))
	for i, e := range failed {
		ds[i] = e.d
	}
	delay := m.k.cfg.backoff(failed[0].base + failed[0].attempts)
	err := m.nacker.Nack(m.ctx, ds, delay)
	var be *driver.MessageErrors
	switch {
	case err == nil:
		nacked = failed
	case errors.As(err, &be) && len(be.Errs) == len(failed):
		for i, e := range failed {
			if be.Errs[i] == nil {
				nacked = append(nacked, e)
			} else {
				rest = append(rest, e)
			}
		}
		m.k.logger.Warn("nack failed for some; retrying those in the engine", "failed", len(rest), "of", len(failed), "err", err)
	default:
		m.k.logger.Warn("nack failed; retrying in the engine", "err", err)
		return nil, failed
	}
	for _, e := range nacked {
		m.emit(Event{Kind: EventRetried, Lane: e.d.Lane, Message: &e.msg, Delay: delay})
	}
	return nacked, rest
}

// deadLetter publishes e to the dead-letter topic, once, under the lane's
// context: a lane that moved to another member stops dead-lettering here.
// A failure is logged with what it means; the caller parks e and tries
// again after a backoff. A dead letter the topic refuses for good
// (too large even with its reason trimmed, an invalid or missing topic, no
// permission) is tried again all the same, at most every BackoffMax: the
// refusal may be fixed (a topic created, a permission granted), and
// settling the message without it landing would lose it.
func (m *member) deadLetter(ctx context.Context, e *entry) error {
	cfg := &m.k.cfg
	dm := m.deadMessage(e)
	err := m.k.client.publish(ctx, cfg.deadLetter, []*driver.Message{dm}, driver.PublishOptions{Durability: DurabilityAll, DeadLetter: true}, false)
	if err == nil {
		m.emit(Event{Kind: EventDeadLettered, Lane: e.d.Lane, Message: &e.msg, Err: e.err})
		return nil
	}
	if ctx.Err() != nil {
		return err // the lane is going: its next owner handles the message
	}
	e.deadTries++
	refused := !errors.Is(err, ErrRetryable) && (errors.Is(err, ErrTooLarge) || errors.Is(err, ErrInvalid) ||
		errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnsupported))
	m.k.logger.Error("dead letter not published; it holds its key and is tried again",
		"dlq", cfg.deadLetter, "id", e.msg.ID, "lane", e.d.Lane, "tries", e.deadTries, "refused", refused, "err", err)
	m.emit(Event{Kind: EventDeadLetterFailed, Lane: e.d.Lane, Message: &e.msg, Err: err})
	if republishable(err) {
		m.k.client.retryHooks(PublishRetry{Topic: cfg.deadLetter, IDs: []string{dm.ID}, Attempt: e.deadTries, Err: err, Delay: cfg.backoff(e.deadTries)})
	}
	return err
}

// deadMessage is e as a dead letter: the message with headers saying why.
// When the transport has a size limit and the reason pushes the message
// over it, the reason is cut to fit.
func (m *member) deadMessage(e *entry) *driver.Message {
	cfg := &m.k.cfg
	h := make(map[string]string, len(e.msg.Headers)+8)
	for k, v := range e.msg.Headers {
		h[k] = v
	}
	h[HeaderDeadReason] = e.err.Error()
	h[HeaderDeadAttempts] = strconv.Itoa(e.base + e.attempts)
	h[HeaderDeadTopic] = m.k.topic
	h[HeaderDeadGroup] = cfg.group
	h[HeaderDeadLane] = e.d.Lane
	h[HeaderDeadPosition] = e.d.Position
	h[HeaderDeadFirstFailure] = e.firstFail.UTC().Format(time.RFC3339Nano)
	h[HeaderDeadLastFailure] = e.lastFail.UTC().Format(time.RFC3339Nano)
	dm := &driver.Message{ID: e.msg.ID, Key: e.msg.Key, Type: e.msg.Type, Source: e.msg.Source, Time: e.msg.Time, ContentType: e.msg.ContentType, Headers: h, Body: e.msg.Body}
	if limit := m.k.client.caps.MaxMessageBytes; limit > 0 {
		if over := dm.Size() - limit; over > 0 {
			reason := h[HeaderDeadReason]
			h[HeaderDeadReason] = strings.ToValidUTF8(reason[:max(0, len(reason)-over)], "")
		}
	}
	return dm
}

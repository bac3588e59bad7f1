package omnibus

// Workers: slots with work wait in the member's run queue; a pool of
// workers, at most MaxInFlight, runs them, one worker per slot at a time,
// so a key's messages run in order while other keys run. The run queue
// and the worker counts are guarded by member.mu; a worker runs handlers
// with no lock held.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// startLocked queues the active slot s for a worker.
//
// Workers start on demand and outlive their slots: a worker that takes a
// slot and leaves more queued wakes (or starts) one more, so the pool grows
// with the backlog, up to MaxInFlight workers (the bound on handlers
// running at once), and a steady flow costs no goroutine (nor a hand-off)
// per message. An idle worker waits while fewer than maxIdle others do,
// and ends otherwise.
func (m *member) startLocked(s *slot) {
	m.runq = append(m.runq, s)
	if m.waking == 0 {
		m.wakeLocked()
	}
}

// wakeLocked wakes an idle worker, or starts one unless MaxInFlight are
// running: then one of them takes the queue's next slot when it is done.
func (m *member) wakeLocked() {
	if m.idle > 0 {
		m.waking++
		m.idle--
		m.cond.Signal()
		return
	}
	if m.workers >= m.k.cfg.maxInFlight {
		return
	}
	m.waking++
	m.workers++
	m.wg.Add(1)
	go m.worker()
}

func (m *member) worker() {
	defer m.wg.Done()
	maxIdle := max(4, runtime.GOMAXPROCS(0))
	m.mu.Lock()
	defer m.mu.Unlock()
	defer func() { m.workers-- }()
	m.waking--
	for !m.stopped {
		if m.runqHead == len(m.runq) {
			if m.idle >= maxIdle {
				return
			}
			m.idle++
			m.cond.Wait() // wakeLocked counted it out of idle
			m.waking--
			continue
		}
		s := m.runq[m.runqHead]
		m.runq[m.runqHead] = nil
		if m.runqHead++; m.runqHead == len(m.runq) {
			m.runq, m.runqHead = m.runq[:0], 0
		} else if m.waking == 0 {
			m.wakeLocked()
		}
		m.mu.Unlock()
		m.run(s)
		m.mu.Lock()
	}
}

// run handles s's queue in order until the queue is empty or a retry has
// to wait. A loose slot (OrderNone) arrives with its one entry already
// taken for it by dispatch.
func (m *member) run(s *slot) {
	ready := s.loose && s.running == 1
	for {
		var batch []*entry
		var wait time.Duration
		if ready {
			batch, ready = s.one[:], false
		} else {
			batch, wait = m.take(s)
		}
		if wait > 0 {
			if !m.waitBatch(s, wait) {
				return
			}
			continue
		}
		if batch == nil {
			return
		}
		suspect := batch[0].suspect
		if suspect {
			// One suspect at a time in the member: a crash while it runs
			// is its own.
			select {
			case m.guardTurn <- struct{}{}:
			case <-s.lane.ctx.Done():
				m.release(s)
				return
			}
			if !batch[0].dead {
				m.begin(batch[0]) // may find it exhausted
			}
		}
		var latency time.Duration
		if !batch[0].dead { // a dead letter waiting to land is only published
			latency = m.invoke(s.lane.ctx, batch)
		}
		more := m.settle(s, batch, latency)
		if suspect {
			<-m.guardTurn
		}
		if !more {
			return
		}
	}
}

// take returns the next batch of s to handle, or a time to wait for more
// messages, or nil when the slot is done (it then releases s). A dead
// letter waiting to land makes a batch of its own.
func (m *member) take(s *slot) ([]*entry, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := s.lane
	if len(s.queue) == 0 || l.gone || m.ctx.Err() != nil {
		s.active = false
		l.dropSlotLocked(s)
		return nil, 0
	}
	n := 1
	if m.k.batch != nil && !s.queue[0].dead && !s.queue[0].suspect {
		cfg := &m.k.cfg
		bytes := s.queue[0].size
		for n < len(s.queue) && n < cfg.batchCount && !s.queue[n].dead && !s.queue[n].suspect && bytes+s.queue[n].size <= cfg.batchBytes {
			bytes += s.queue[n].size
			n++
		}
		// A partial batch waits for more only while more can come: not
		// while the fetch loop waits for room (MaxInFlight or
		// MaxInFlightBytes reached), nor while the member drains.
		full := n == cfg.batchCount || n < len(s.queue) || m.fetchIdle
		if age := time.Since(s.queue[0].arrived); !full && !m.draining && age < cfg.batchPeriod {
			if s.wake == nil {
				s.wake = make(chan struct{}, 1)
			}
			return nil, cfg.batchPeriod - age
		}
	}
	s.running = n
	return s.queue[:n:n], 0
}

// wakeBatchesLocked makes the batches waiting to fill look again: the
// member drains, or the fetch loop waits for room, so no more is coming.
func (m *member) wakeBatchesLocked() {
	for _, l := range m.lanes {
		for _, s := range l.slots {
			if s.wake != nil {
				driver.Notify(s.wake)
			}
		}
		if s := l.guard; s != nil && s.wake != nil {
			driver.Notify(s.wake)
		}
	}
}

// waitBatch waits for a batch to fill; false when the member is closing.
func (m *member) waitBatch(s *slot, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.wake:
	case <-s.lane.ctx.Done():
		return false
	}
	return true
}

// invoke runs the handler on batch and leaves each entry's outcome in
// its err. Handle hooks wrap the call and see what the handler returned
// (a panic as an error).
func (m *member) invoke(ctx context.Context, batch []*entry) (latency time.Duration) {
	for _, e := range batch {
		e.attempts++
		e.msg.Attempt = e.base + e.attempts
		e.err = nil
	}
	var msgs []*Message
	if m.k.batch != nil || len(m.k.hooks.handle) > 0 {
		msgs = make([]*Message, len(batch))
		for i, e := range batch {
			msgs[i] = &e.msg
		}
	}
	var end func(error)
	if hs := m.k.hooks.handle; len(hs) > 0 {
		ctx, end = wrap(ctx, hs, func(h HandleHook, ctx context.Context) (context.Context, func(error)) {
			return h.OnHandle(ctx, m.k.topic, msgs)
		})
	}
	var start time.Time
	if m.k.hooks.events { // only events report it
		start = time.Now()
	}
	var err error
	defer func() {
		if !start.IsZero() {
			latency = time.Since(start)
		}
		if r := recover(); r != nil {
			m.k.logger.Error("handler panicked", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panic: %v", r)
		}
		errs := batchErrors(m.k.batch != nil, err, len(batch))
		for i, e := range batch {
			if errs != nil {
				e.err = errs[i]
			} else {
				e.err = err
			}
		}
		if end != nil {
			end(err)
		}
	}()
	if m.k.handler != nil {
		err = m.k.handler(ctx, &batch[0].msg)
	} else {
		err = m.k.batch(ctx, msgs)
	}
	return 0
}

// batchErrors returns the per-message errors of a batch handler's
// *BatchError that names each of the n messages, or nil. It is apart from
// invoke so that the BatchError variable escapes only for batch handlers.
func batchErrors(batch bool, err error, n int) []error {
	if !batch || err == nil {
		return nil
	}
	var be *BatchError
	if errors.As(err, &be) && len(be.Errs) == n {
		return be.Errs
	}
	return nil
}

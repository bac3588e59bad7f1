package natsbus

// The keeper: one goroutine per member that sends in-progress signals
// for what the member holds and records the group's positions (see
// positions); recordLane also runs on the balancer and in Close. sub.mu
// guards the held set and the readers it walks; the signals and the
// position writes go out with no lock held.

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// maxHold bounds how long in-progress signals keep a delivery of an
// unpartitioned group from being redelivered (to any member), so that a
// handler that never returns does not hold its message for ever. A
// partition's deliveries are kept in progress as long as the member
// holds them and its lease: letting one go would have it redelivered
// behind newer messages of its lane.
func (s *sub) maxHold() time.Duration { return max(10*s.c.cfg.ackWait, 5*time.Minute) }

// startKeeper starts the goroutine that tells the server that what the
// member holds (pulled and not settled, wherever it waits: in the inbox,
// in carry or in the engine) is still in progress, so that neither a
// backlog nor a slow handler nor a retry waiting in the engine causes
// redeliveries; a delivery is signalled every ack_wait/4 to ack_wait/2.
// For a group that records positions it also records those of the lanes
// the member reads, every recordEvery.
func (s *sub) startKeeper() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		every := max(s.c.cfg.ackWait/4, 50*time.Millisecond)
		t := time.NewTicker(every)
		defer t.Stop()
		recorded := time.Now()
		for {
			select {
			case <-s.closed:
				return
			case now := <-t.C:
				s.signal(now, every)
				if s.pos != nil && now.Sub(recorded) >= recordEvery {
					recorded = now
					ctx, cancel := context.WithTimeout(context.Background(), every)
					s.record(ctx)
					cancel()
				}
			}
		}
	}()
}

// signal sends in-progress signals for the deliveries held longer than
// every since they were pulled or last signalled.
func (s *sub) signal(now time.Time, every time.Duration) {
	var due []jetstream.Msg
	s.mu.Lock()
	for h := range s.held.all() {
		switch {
		case !h.r.valid(now):
			s.held.remove(h) // the lease ran out
		case !h.r.exclusive && now.Sub(h.first) > s.maxHold():
			s.held.remove(h) // let the server redeliver it
		case now.Sub(h.since) >= every:
			h.since = now
			due = append(due, h.msg)
		}
	}
	s.mu.Unlock()
	for _, m := range due {
		_ = m.InProgress()
	}
}

// record raises the group's recorded position of every lane the member
// reads to the sequence after its consumer's ack floor.
func (s *sub) record(ctx context.Context) {
	s.mu.Lock()
	readers := make([]*reader, 0, len(s.readers))
	for _, r := range s.readers {
		readers = append(readers, r)
	}
	s.mu.Unlock()
	for _, r := range readers {
		s.recordLane(ctx, r)
	}
}

// recordLane raises the recorded position of r's lane to the sequence
// after its consumer's ack floor.
func (s *sub) recordLane(ctx context.Context, r *reader) {
	if s.pos == nil || !r.valid(time.Now()) {
		return
	}
	info, err := r.consumer().Info(ctx)
	if err != nil {
		return
	}
	if r.exclusive && info.AckFloor.Consumer > 0 {
		s.mu.Lock()
		if info.AckFloor.Stream > r.floor {
			s.settled.forgetLocked(r.lane, info.AckFloor.Stream)
		}
		r.raiseFloorLocked(info.AckFloor.Stream)
		s.mu.Unlock()
	}
	if next, ok := resumeSeq(info); ok {
		if err := s.pos.raise(ctx, r.lane, next); err != nil {
			// The bucket may have been deleted after the consumer was
			// created again: the next record finds it restored.
			rctx, cancel := context.WithTimeout(context.Background(), recordEvery)
			_ = s.pos.restore(rctx)
			cancel()
		}
	}
}

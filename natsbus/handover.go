package natsbus

// Hand-overs: what a member does when a partition changes hands. A new
// owner resets the partition's consumer at its ack floor and takes its
// pin (prepare, unpin); an old one forgets the lane's reader, waits
// until the server applied its acknowledgements (settle) and, on Close,
// leaves. It runs on the balancer, the watchdog (a lost lane's detach)
// and Close; sub.mu guards the held set, kvMu the leases.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// prepare returns partition part's consumer, ready for a new owner.
//
// Deliveries the previous owner left unacknowledged (in flight when it
// crashed, abandoned after its drain bound, or prefetched and never
// handed to its engine) would come back only after AckWait, behind newer
// messages. So when the consumer has any, prepare deletes it and creates
// it again at its ack floor (DeliverByStartSequence = floor + 1): the new
// owner reads them first, in order. Messages above the floor that were
// acknowledged out of order come again too (redeliveries, in order;
// those this member acknowledged itself it does not hand on again, see
// settled.go). The
// start is recorded in the group's positions before the delete, so that
// a create that fails leaves the next claim to create the consumer there.
func (p *partitioned) prepare(part int) (jetstream.Consumer, error) {
	s := p.s
	lane := strconv.Itoa(part)
	cons, err := s.consumer(p.ctx, lane)
	if err != nil {
		return nil, err
	}
	info := cons.CachedInfo()
	name := s.consumerName(lane)
	start, ok := resumeSeq(info)
	if info.NumAckPending == 0 || !ok { // nothing to redeliver, or cannot tell where it began (DeliverNew)
		if cfg := info.Config; !pinned(info) && s.c.canPin() {
			// Made before pinning (or on an older server): pin it now.
			s.c.pin(&cfg)
			if up, err := s.c.js.UpdateConsumer(p.ctx, s.ref.name, cfg); err == nil {
				cons = up
			}
		}
		return cons, p.unpin(cons)
	}
	if err := s.pos.raise(p.ctx, lane, start); err != nil {
		return nil, err
	}
	cfg := info.Config
	s.c.pin(&cfg)
	cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, start, nil
	if err := s.c.js.DeleteConsumer(p.ctx, s.ref.name, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("reset consumer %q of stream %q at sequence %d: %w", name, s.ref.name, start, classify(err))
	}
	cons, err = s.c.js.CreateConsumer(p.ctx, s.ref.name, cfg)
	if err != nil {
		return nil, fmt.Errorf("reset consumer %q of stream %q at sequence %d: %w", name, s.ref.name, start, classify(err))
	}
	return cons, nil
}

// unpin takes a pinned consumer's pin from whichever client holds it
// (the lane's previous owner), so that the server serves this member's
// pulls from now on and answers the previous owner's with a pin mismatch.
func (p *partitioned) unpin(cons jetstream.Consumer) error {
	info := cons.CachedInfo()
	if !pinned(info) {
		return nil
	}
	st, err := p.s.c.js.Stream(p.ctx, info.Stream)
	if err == nil {
		err = st.UnpinConsumer(p.ctx, info.Name, pinGroup)
	}
	if err != nil {
		return fmt.Errorf("unpin consumer %q of stream %q: %w", info.Name, info.Stream, classify(err))
	}
	return nil
}

// detach forgets r after its lane was revoked or lost and returns the
// lowest stream sequence of its deliveries left unacknowledged (0 for
// none).
func (p *partitioned) detach(r *reader) (low uint64) {
	s := p.s
	s.mu.Lock()
	if s.readers[r.lane] == r {
		delete(s.readers, r.lane)
	}
	low = s.lowestHeldLocked(r, true)
	s.mu.Unlock()
	<-r.done
	return low
}

// lowestHeldLocked returns the lowest stream sequence of partition
// reader r's deliveries not yet acknowledged, and forgets them when drop
// is set.
func (s *sub) lowestHeldLocked(r *reader, drop bool) (low uint64) {
	if r.first != nil {
		low = r.first.seq
	}
	for h := r.first; drop && h != nil; h = r.first {
		s.held.remove(h)
	}
	return low
}

// settle waits, for up to two seconds, until the server has applied the
// acknowledgements this member wrote for r's lane (they are asynchronous),
// so that the lane's next owner, which starts after the ack floor, does
// not read them again. low is the lowest sequence left unacknowledged.
func (p *partitioned) settle(ctx context.Context, r *reader, low uint64) {
	target := r.acked.Load()
	if low > 0 && low-1 < target {
		target = low - 1
	}
	if target == 0 || !r.valid(time.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = p.s.c.nc.FlushWithContext(ctx)
	for {
		info, err := r.consumer().Info(ctx)
		if err != nil || info.NumAckPending == 0 || (info.AckFloor.Consumer > 0 && info.AckFloor.Stream >= target) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// leave releases every lease the member still holds, after its readers
// stopped (Close): it waits for its acknowledgements, records the lanes'
// positions and deletes the leases, then deletes any lease that still
// holds its ID (one whose claim it never learnt the outcome of) and its
// heartbeat.
func (p *partitioned) leave(ctx context.Context) {
	p.kvMu.Lock()
	leases := p.leases
	p.leases = map[int]*lease{}
	p.kvMu.Unlock()
	for _, l := range leases {
		if l.lost {
			continue
		}
		if r := l.reader; r != nil {
			p.s.mu.Lock()
			low := p.s.lowestHeldLocked(r, false)
			p.s.mu.Unlock()
			p.settle(ctx, r, low)
			p.s.recordLane(ctx, r)
		}
		_ = p.kv.Delete(ctx, leaseKey(l.part), jetstream.LastRevision(l.rev))
	}
	for part := range p.parts {
		p.free(part)
	}
	_ = p.kv.Delete(ctx, memberKey(p.id))
}

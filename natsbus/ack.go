package natsbus

// Settlement: Ack and Nack take their deliveries out of the held set and
// acknowledge or nak them on the server. Ack runs on the engine's settle
// loop, Nack on its workers; sub.mu guards the held set and what the
// readers remember of the sequences acknowledged and handed back.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// take removes the deliveries from the held set and returns their
// messages, leaving out those of lanes whose lease ran out (the lane's
// next owner reads them again; this member, should it be the next, only
// acknowledges those it handled). With ack, it records the highest
// sequence acknowledged per reader, and returns the sequences whose run
// counts (CountRun) Ack deletes; without (Nack), a partition's reader
// expects them back.
func (s *sub) take(ds []*driver.Delivery, ack bool) (msgs []jetstream.Msg, counted []uint64) {
	msgs = make([]jetstream.Msg, 0, len(ds))
	now := time.Now()
	var buf [64]*held
	exclusive := buf[:0] // acknowledged, of partitions
	s.mu.Lock()
	for _, d := range ds {
		h, ok := d.Token.(*held)
		if !ok {
			continue
		}
		if s.held.remove(h) && h.r.valid(now) {
			msgs = append(msgs, h.msg)
			if ack && h.r.exclusive {
				exclusive = append(exclusive, h)
			}
			if h.counted && ack {
				counted = append(counted, h.seq)
			}
			switch {
			case ack && !h.r.exclusive:
				h.r.recent[h.r.recentAt] = h.seq
				h.r.recentAt = (h.r.recentAt + 1) % recentAcks
			case ack:
				h.r.ackedLocked(h.seq)
			case !ack && h.r.exclusive:
				h.r.nacked[h.seq] = struct{}{}
			}
		} else if ack && h.r.exclusive {
			// Handled, but the lease ran out first: not acknowledged, and
			// the lane's next claim redelivers it. Should that be this
			// member's, it does not hand it on again (see settled.go).
			s.settled.settleLocked(h.r.lane, h.seq, h.d.ID, 1)
		}
	}
	s.settleLocked(exclusive)
	s.mu.Unlock()
	return msgs, counted
}

// Ack implements driver.Acker. It returns once the server has read the
// acknowledgements (a flush: PING, PONG), so what Ack returned for is not
// delivered again when the process dies the moment after (the engine runs
// a suspect only then); an ack still in the connection's buffer would die
// with it. The server applies what it read whatever becomes of the
// connection.
func (s *sub) Ack(ctx context.Context, ds []*driver.Delivery) error {
	var errs []error
	msgs, counted := s.take(ds, true)
	for _, m := range msgs {
		if err := m.Ack(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("natsbus: ack %q: %d of %d failed: %w", s.topic, len(errs), len(ds), classify(errors.Join(errs...)))
	}
	// The acks are written: a ctx ending now must not fail them.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushWait)
	defer cancel()
	if err := s.c.nc.FlushWithContext(fctx); err != nil {
		return fmt.Errorf("natsbus: ack %q: the server did not confirm reading the acks: %w", s.topic, classify(err))
	}
	if len(counted) > 0 {
		s.pos.forgetRuns(fctx, counted)
	}
	return nil
}

// flushWait bounds Ack's wait for the server to confirm reading its
// acknowledgements.
const flushWait = 5 * time.Second

// Nack implements driver.Nacker with NakWithDelay.
func (s *sub) Nack(_ context.Context, ds []*driver.Delivery, delay time.Duration) error {
	var errs []error
	msgs, _ := s.take(ds, false) // a nacked message comes back: its run count stays
	for _, m := range msgs {
		if err := m.NakWithDelay(delay); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("natsbus: nack %q: %d of %d failed: %w", s.topic, len(errs), len(ds), classify(errors.Join(errs...)))
	}
	return nil
}

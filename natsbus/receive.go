package natsbus

// Receive: what the pumps left in the inbox, handed to the engine as far
// as it fits in the engine's room. It runs on the engine's fetch loop,
// one Receive at a time, so its own state (sub.batch, carry, failed)
// needs no lock.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// Receive implements driver.Subscriber. It returns what the inbox holds
// and fits in room, waiting only while the inbox is empty; deliveries
// that did not fit wait in carry for the next Receive. A failed read is
// returned on its own: when deliveries come with it, by the next Receive.
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	if err := s.failed; err != nil {
		s.failed = nil
		return nil, err
	}
	for {
		took := 0
		if len(s.carry) == 0 {
			s.batch = s.inbox.take(s.batch[:0], max(1, room.Count))
			took = len(s.batch)
			now := time.Now()
			for i, it := range s.batch {
				s.batch[i] = item{}
				if it.r.stopped.Load() || !it.r.valid(now) {
					continue // of a lane given up
				}
				if it.err != nil {
					if s.failed == nil {
						s.failed = s.readError(it)
					}
					continue
				}
				if it.r.exclusive {
					s.claim(ctx, it.h)
				}
				s.carry = append(s.carry, &it.h.d)
			}
		}
		if ds := s.fit(room); len(ds) > 0 || len(s.carry) > 0 {
			return ds, nil
		}
		if err := s.failed; err != nil {
			s.failed = nil
			return nil, err
		}
		if took > 0 {
			continue // all were of lanes given up: look again
		}
		select {
		case <-s.inbox.ready:
		case <-s.wake:
			return nil, nil // a lane is being revoked or lost
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closed:
			return nil, fmt.Errorf("natsbus: receive %q: %w", s.topic, driver.ErrClosed)
		}
	}
}

// fit takes from carry the deliveries that fit in room, in order,
// dropping those of lanes given up meanwhile.
func (s *sub) fit(room driver.Room) []*driver.Delivery {
	var ds []*driver.Delivery
	now := time.Now()
	bytes, i := 0, 0
	for ; i < len(s.carry); i++ {
		d := s.carry[i]
		if r := d.Token.(*held).r; r.stopped.Load() || !r.valid(now) {
			continue
		}
		size := d.Size()
		if !room.Fits(len(ds), bytes, size) {
			break
		}
		bytes += size
		ds = append(ds, d)
	}
	rest := copy(s.carry, s.carry[i:])
	clear(s.carry[rest:])
	s.carry = s.carry[:rest]
	return ds
}

// readError is the error a failed read reports to the engine.
func (s *sub) readError(it item) error {
	if errors.Is(it.err, errReopened) {
		return it.err
	}
	err := classify(it.err)
	if errors.Is(err, jetstream.ErrMsgIteratorClosed) && s.c.nc.IsClosed() {
		err = fmt.Errorf("%w: %w", err, driver.ErrClosed)
	}
	if errors.Is(err, driver.ErrNotFound) {
		s.c.forget(s.topic)
	}
	return fmt.Errorf("natsbus: receive %q lane %s: %w", s.topic, it.r.lane, err)
}

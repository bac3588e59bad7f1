package redisbus

// Receive and acknowledgements: Receive asks the reader for a read and
// hands out what fits in the engine's room, keeping the rest (its
// carry) first in line; Ack acknowledges with XACK, or, partitioned,
// with a script that checks the lease the entries were read under.
// Receive runs on the engine's fetch goroutine; Ack on its settle loop.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/driver"
)

// ackBatch bounds the IDs of one XACK.
const ackBatch = 1000

// Receive implements driver.Subscriber. It returns early, with nothing,
// when a lane is revoked or lost, and never returns deliveries of a
// lane that went.
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	if len(s.carry) == 0 {
		s.ask(room)
		select {
		case r := <-s.results:
			s.asked = false
			if r.err != nil {
				return nil, r.err
			}
			s.carry = r.ds
			if len(r.ds) > 0 {
				bytes := 0
				for _, d := range r.ds {
					bytes += d.Size()
				}
				s.size = max(bytes/len(r.ds), 1)
			}
		case <-s.wake:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, errClosed
		}
	}
	n, bytes := 0, 0
	var out []*driver.Delivery
	for n < len(s.carry) {
		d := s.carry[n]
		if l := d.Token.(*lane); l.off.Load() {
			n++ // the lane went: its next owner reads it again
			continue
		}
		size := d.Size()
		if !room.Fits(len(out), bytes, size) {
			break
		}
		out = append(out, d)
		bytes += size
		n++
	}
	s.carry = s.carry[n:]
	if len(s.carry) == 0 {
		// Read on while the engine works on these: the next read is
		// there when it asks (one read beyond its bounds, at most).
		s.carry = nil
		s.ask(room)
	}
	return out, nil
}

// ask asks the reader for a read, unless one is asked for: the engine's
// whole window, MaxInFlight entries and, at the mean size of the last
// read's, MaxInFlightBytes, so that reads are as large as the engine
// allows however little room it has now (what does not fit waits in the
// carry).
func (s *sub) ask(room driver.Room) {
	if s.asked {
		return
	}
	n := max(room.Count, s.opts.MaxInFlight, 1)
	if s.size > 0 && s.opts.MaxInFlightBytes > 0 {
		n = min(n, max(s.opts.MaxInFlightBytes/s.size, 1))
	}
	s.want <- n // the reader took the last request: room for one
	s.asked = true
}

// Ack implements driver.Acker: XACK per stream, pipelined. Partitioned,
// each lane's entries are acknowledged only while the lane's lease holds
// the fencing token they were read under (ackScript); a lane whose lease
// went is reported lost, and its entries stay pending for the next owner.
// Entries whose acknowledgement failed otherwise (the connection broke)
// go with the next call (the keeper's or the refresher's, when no other
// comes), so that a settled entry does not stay pending: nobody would
// take it over while the member holds the lane, and the next owner would
// handle it again after newer ones.
//
// The run counts of the entries acknowledged (see CountRun) go with
// them: ackScript deletes them, partitioned; unpartitioned, an HDEL in
// the XACKs' pipeline deletes those of the entries delivered more than
// once (the only ones counted) and of those acknowledged again.
func (s *sub) Ack(ctx context.Context, ds []*driver.Delivery) error {
	byLane := map[*lane][]string{}
	// Unpartitioned, the entries whose run counts the pipeline deletes:
	// a list of its own (appending to one shared with byLane would
	// overwrite byLane's), and no map unless there are some.
	var counted map[*lane][]string
	count := func(l *lane, ids ...string) {
		if s.parts > 0 {
			return
		}
		if counted == nil {
			counted = map[*lane][]string{}
		}
		counted[l] = append(counted[l], ids...)
	}
	s.mu.Lock()
	for _, l := range s.lanes {
		if len(l.reack) > 0 {
			byLane[l], l.reack = l.reack, nil
			count(l, byLane[l]...)
			for _, id := range byLane[l] {
				delete(s.held, id) // held again if this try fails too (fail)
			}
		}
	}
	s.mu.Unlock()
	for _, d := range ds {
		l := d.Token.(*lane)
		if !l.gone.Load() {
			if byLane[l] == nil {
				// Room for all: unpartitioned, they are all of one lane
				// (growing the list was a third of Ack's time).
				byLane[l] = make([]string, 0, len(ds))
			}
			byLane[l] = append(byLane[l], d.Position)
			if d.Attempt > 1 {
				count(l, d.Position)
			}
		}
	}
	if s.parts == 0 {
		s.unhold(ds)
	}
	var errs []error
	fail := func(l *lane, batch []string, err error, again bool) {
		errs = append(errs, fmt.Errorf("redisbus: ack on stream %q group %q: %w", l.stream, s.group, err))
		if !again {
			return
		}
		s.mu.Lock()
		l.reack = append(l.reack, batch...)
		if s.parts == 0 {
			for _, id := range batch {
				s.held[id] = struct{}{}
			}
		}
		s.mu.Unlock()
	}
	if s.parts > 0 {
		for l, ids := range byLane {
			for batch := range slices.Chunk(ids, ackBatch) {
				args := []any{s.group, l.token}
				for _, id := range batch {
					args = append(args, id)
				}
				n, err := ackScript.Run(ctx, s.c.rdb, []string{l.stream, l.lease, runsKey(l.stream, s.group)}, args...).Int64()
				switch {
				case err != nil:
					fail(l, batch, classify(err), true)
				case n < 0:
					s.part.fenced(l)
					fail(l, batch, fmt.Errorf("the lease of lane %s is no longer this member's", l.id), false)
				}
			}
		}
		return errors.Join(errs...)
	}
	type sent struct {
		l     *lane
		batch []string
		cmd   *redis.IntCmd
	}
	var cmds []sent
	pipe := s.c.rdb.Pipeline()
	for l, ids := range byLane {
		for batch := range slices.Chunk(ids, ackBatch) {
			cmds = append(cmds, sent{l, batch, pipe.XAck(ctx, l.stream, s.group, batch...)})
		}
		// After the XACKs, run whatever their outcome: an entry whose
		// XACK failed is counted again from its first holder, which
		// ran it and settled it; a record left behind only takes
		// room (runScript deletes it when the entry is not pending).
		for batch := range slices.Chunk(counted[l], ackBatch) {
			pipe.HDel(ctx, runsKey(l.stream, s.group), batch...)
		}
	}
	if len(cmds) > 0 {
		_, _ = pipe.Exec(ctx)
	}
	for _, c := range cmds {
		if err := c.cmd.Err(); err != nil {
			fail(c.l, c.batch, classify(err), true)
		}
	}
	return errors.Join(errs...)
}

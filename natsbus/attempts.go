package natsbus

// Attempts across holders of a partition (driver.AttemptKeeper): a new
// owner resets a partition's consumer (see prepare), which starts its
// delivery counts afresh, so a partitioned group keeps its own count in
// the group's position bucket: key "b.<lane>" says how many holders
// began the lane's message at a stream sequence without settling it. A
// member reads it at the first delivery of a lane it claimed (Receive),
// recording its own claim only where no holder began that message, and
// records each message the engine begins while it guards the lane
// (Begin). A record names the member that wrote it last: a member that
// lost the lane and claimed it again is alive, so it did not crash on
// the message, and it is not counted twice. An unpartitioned group keeps
// the server's delivery count, but counts the holders that ran a
// redelivered message (driver.RunCounter, key "r.<sequence>", see
// CountRun). It runs on the engine's fetch loop, workers and settle loop;
// the bucket's revision orders the writers, and the lease decides who
// may write a partition's record.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// CountRun implements driver.RunCounter for an unpartitioned group,
// whose Attempt is the server's delivery count (NumDelivered). That
// count rises for a message a crashed member held without running it,
// behind the poisoned message, and for one the server pulled to a member
// that had died; such a message would reach MaxAttempts with the
// poisoned one. So the group keeps its own count of the holders that ran
// a redelivered message, in key "r.<sequence>" of the positions bucket,
// and Ack deletes it. The message's first holder is counted without a
// record. A throwaway group keeps no positions: the server's count
// stands.
func (s *sub) CountRun(ctx context.Context, d *driver.Delivery) (int, error) {
	h, ok := d.Token.(*held)
	if !ok {
		return 0, fmt.Errorf("natsbus: count runs on %q: delivery of lane %q is not from natsbus: %w", s.topic, d.Lane, driver.ErrInvalid)
	}
	if s.pos == nil {
		return d.Attempt, nil
	}
	n, err := s.pos.countRun(ctx, h.seq)
	if err != nil {
		return 0, fmt.Errorf("natsbus: count runs on %q of sequence %d: %w", s.topic, h.seq, err)
	}
	s.mu.Lock()
	h.counted = true
	s.mu.Unlock()
	return n, nil
}

// runs is an unpartitioned group's record of the holders that ran the
// message at a stream sequence.
type runs struct {
	Holders       int       `json:"holders"`
	StreamCreated time.Time `json:"stream_created"`
}

func runKey(seq uint64) string { return "r." + strconv.FormatUint(seq, 10) }

// countRun records one more holder running the message at seq and
// returns how many did: those recorded, this one, and the first, which
// ran it unrecorded.
func (p *positions) countRun(ctx context.Context, seq uint64) (int, error) {
	key := runKey(seq)
	for range 3 {
		v, rev, err := p.read(ctx, key)
		if err != nil {
			return 0, err
		}
		var rec runs
		if rev != 0 && (json.Unmarshal(v, &rec) != nil || !rec.StreamCreated.Equal(p.created) || rec.Holders < 1) {
			rec = runs{} // another stream's, or not a record
		}
		rec = runs{Holders: max(rec.Holders, 1) + 1, StreamCreated: p.created}
		b, _ := json.Marshal(rec) // a number and a time
		switch err := p.put(ctx, key, b, rev); {
		case err == nil:
			return rec.Holders, nil
		case !errors.Is(err, errConflict):
			return 0, err
		}
		// another holder wrote meanwhile: read it again
	}
	return 0, fmt.Errorf("%w: %w", errConflict, driver.ErrRetryable)
}

// forgetRuns deletes the run counts of messages acknowledged; one left
// behind only takes room.
func (p *positions) forgetRuns(ctx context.Context, seqs []uint64) {
	for _, seq := range seqs {
		_ = p.bucket().Delete(ctx, runKey(seq))
	}
}

// keeping is a partitioned group's subscriber: a sub that keeps attempts
// across holders.
type keeping struct{ *sub }

// Begin implements driver.AttemptKeeper: d is its lane's resume position
// (the engine settled everything before it), and this member begins it.
func (k keeping) Begin(ctx context.Context, d *driver.Delivery) (int, error) {
	h, ok := d.Token.(*held)
	if !ok {
		return 0, fmt.Errorf("natsbus: begin %q: delivery of lane %q is not from natsbus: %w", k.topic, d.Lane, driver.ErrInvalid)
	}
	return k.begin(ctx, h)
}

// claim gives the first delivery of a lane this member claimed its
// Attempt: the holders that began it, plus this one. It records this
// one's claim only when none did (Begin records a suspect's when it
// runs). That delivery is the lane's first unsettled message: the
// consumer starts after its ack floor (claimAt), and the sequences
// between belong to other partitions or were settled. Other deliveries
// of a partition keep Attempt 0. A failed record leaves it uncounted:
// the count is a safeguard, not a reason to stop.
func (s *sub) claim(ctx context.Context, h *held) {
	at := h.r.claimAt.Load()
	if at == 0 || h.seq < at || !h.r.claimAt.CompareAndSwap(at, 0) {
		return
	}
	if rec, err := s.begunBy(ctx, h); err == nil && rec.Holders > 0 {
		if me := s.memberID(); me != "" && rec.Member == me {
			// This member began it, lost the lane and claimed it again:
			// alive, it did not crash on it, and it is counted already.
			h.d.Attempt = rec.Holders
			return
		}
		h.d.Attempt = rec.Holders + 1 // a suspect: Begin records it when it runs
		return
	}
	n, err := s.begin(ctx, h)
	if err != nil {
		s.c.log.Warn("recording a partition claim's first message failed; it runs uncounted", "topic", s.topic, "lane", h.r.lane, "err", err)
		return
	}
	h.d.Attempt = n
}

// begunBy returns the record of the holders that began h's message.
func (s *sub) begunBy(ctx context.Context, h *held) (begun, error) {
	if s.pos == nil {
		return begun{}, nil
	}
	rec, _, err := s.readBegun(ctx, h)
	return rec, err
}

// memberID is this member's ID in the group's leases; "" unpartitioned.
func (s *sub) memberID() string {
	if s.part == nil {
		return ""
	}
	return s.part.id
}

// readBegun reads h's lane's record and its revision (0: none), a
// record of another message or stream read as none.
func (s *sub) readBegun(ctx context.Context, h *held) (rec begun, rev uint64, err error) {
	v, rev, err := s.pos.read(ctx, begunKey(h.r.lane))
	if err != nil {
		return begun{}, 0, fmt.Errorf("natsbus: begin %q lane %s: %w", s.topic, h.r.lane, err)
	}
	if rev == 0 || json.Unmarshal(v, &rec) != nil || !rec.StreamCreated.Equal(s.pos.created) || rec.Seq != h.seq || rec.Holders < 0 {
		rec = begun{}
	}
	return rec, rev, nil
}

// begun is a lane's record of the holders that began its message at Seq
// without settling it; Member is the last one.
type begun struct {
	Seq           uint64    `json:"seq"`
	Holders       int       `json:"holders"`
	StreamCreated time.Time `json:"stream_created"`
	Member        string    `json:"member,omitempty"`
}

func begunKey(lane string) string { return "b." + lane }

// begin records one more holder beginning h's message and returns how
// many did, this one included.
func (s *sub) begin(ctx context.Context, h *held) (int, error) {
	if s.pos == nil {
		return 1, nil
	}
	for range 3 {
		if !h.r.valid(time.Now()) {
			return 0, fmt.Errorf("natsbus: begin %q lane %s: the lease ran out: %w", s.topic, h.r.lane, driver.ErrRetryable)
		}
		rec, rev, err := s.readBegun(ctx, h)
		if err != nil {
			return 0, err
		}
		me := s.memberID()
		if rec.Holders > 0 && me != "" && rec.Member == me {
			return rec.Holders, nil // begun by this member before it lost the lane: counted
		}
		rec = begun{Seq: h.seq, Holders: rec.Holders + 1, StreamCreated: s.pos.created, Member: me}
		b, _ := json.Marshal(rec) // numbers and a time
		switch err := s.pos.put(ctx, begunKey(h.r.lane), b, rev); {
		case err == nil:
			return rec.Holders, nil
		case !errors.Is(err, errConflict):
			return 0, fmt.Errorf("natsbus: begin %q lane %s: %w", s.topic, h.r.lane, err)
		}
		// another holder wrote meanwhile: read it again
	}
	return 0, fmt.Errorf("natsbus: begin %q lane %s: written concurrently: %w", s.topic, h.r.lane, driver.ErrRetryable)
}

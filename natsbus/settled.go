package natsbus

// What a partitioned member acknowledged out of order, or handled and
// could not acknowledge. A reset (see
// prepare) redelivers every message above a lane's ack floor, those
// acknowledged out of order too; a member that lost a lane and claimed
// it again (its lease ran out under load, a pull failed) would hand the
// engine again what it handled and acknowledged before. So it remembers,
// per lane, the messages it acknowledged while an earlier one of the
// lane was still unsettled (stream sequence, and a hash of the
// message's ID, so that a message of a stream created anew at the same
// sequence is never taken for one), and acknowledges such a redelivery
// again instead of handing it on; so does a message it handled when the
// lane's lease had run out, which it could not acknowledge then. What
// the member acknowledged with nothing earlier unsettled is at or below
// the floor once the server applied it, and nothing needs remembering
// below it. sub.mu guards it; Ack (take) writes it, the pumps (hold)
// read it, the keeper (recordLane) forgets what the consumer's ack floor
// passed, and a lane given up to another member (release) is forgotten.

import (
	"cmp"
	"hash/maphash"
	"slices"
)

// settledLanes is, per lane, the messages this member acknowledged out
// of order, or handled once the lease had run out, by stream sequence,
// ascending.
type settledLanes map[string][]settledMsg

// settledMsg is a message acknowledged out of order: its stream
// sequence and the hash of its ID.
type settledMsg struct{ seq, id uint64 }

// idSeed seeds the hash settledLanes keeps of a message's ID: the hashes
// are compared only within the process.
var idSeed = maphash.MakeSeed()

// idHash is the hash settledLanes keeps of a message's ID.
func idHash(id string) uint64 { return maphash.String(idSeed, id) }

// settleLocked records the acknowledgement of acked, deliveries of
// partitions' readers the member just took out of its held set. Called
// with sub.mu. It costs O(len(acked)) (more only while messages handed
// back with Nack are due): Ack calls it with every batch.
func (s *sub) settleLocked(acked []*held) {
	// The lowest sequence each reader of the batch still has unsettled,
	// looked up once per reader while a few are remembered: the lookup
	// walks the reader's messages handed back with Nack, which a failing
	// OrderNone handler can make as many as MaxInFlight.
	var lows [8]struct {
		r   *reader
		low uint64
	}
	n := 0
	for _, h := range acked {
		i := 0
		for i < n && lows[i].r != h.r {
			i++
		}
		var low uint64
		if i < n {
			low = lows[i].low
		} else {
			low = h.r.lowestUnsettledLocked()
			if n < len(lows) {
				lows[n].r, lows[n].low = h.r, low
				n++
			}
		}
		s.settled.settleLocked(h.r.lane, h.seq, h.d.ID, low)
	}
}

// lowestUnsettledLocked returns the lowest sequence partition reader r
// still has unsettled (0: none): held, or handed back with Nack and due
// to come again. Called with sub.mu.
func (r *reader) lowestUnsettledLocked() uint64 {
	var low uint64
	if r.first != nil {
		low = r.first.seq
	}
	for seq := range r.nacked {
		if low == 0 || seq < low {
			low = seq
		}
	}
	return low
}

// settleLocked records that this member acknowledged the message of ID
// id at stream sequence seq of lane, while low was the lane's lowest
// sequence still unsettled (0: none). With nothing earlier unsettled,
// the lane's floor reaches seq: what it remembers below seq is forgotten
// and seq is not remembered. (A low of 1 remembers seq whatever came
// before it: a message handled and not acknowledged.) Past maxPulled messages a lane's are
// forgotten (a reset then hands them on again: a duplicate, never a
// loss).
func (s settledLanes) settleLocked(lane string, seq uint64, id string, low uint64) {
	ms := s[lane]
	i, found := slices.BinarySearchFunc(ms, seq, func(m settledMsg, seq uint64) int { return cmp.Compare(m.seq, seq) })
	switch {
	case low == 0 || seq < low:
		ms = slices.Delete(ms, 0, i)
	case id == "" || found: // nothing to tell it from another message at seq
	case len(ms) >= maxPulled:
		ms = nil
	default:
		ms = slices.Insert(ms, i, settledMsg{seq, idHash(id)})
	}
	if len(ms) == 0 {
		delete(s, lane)
		return
	}
	s[lane] = ms
}

// settledLocked reports whether this member acknowledged the message of
// ID id at stream sequence seq of lane out of order. Called with sub.mu.
func (s settledLanes) settledLocked(lane string, seq uint64, id string) bool {
	ms := s[lane]
	i, found := slices.BinarySearchFunc(ms, seq, func(m settledMsg, seq uint64) int { return cmp.Compare(m.seq, seq) })
	return found && id != "" && ms[i].id == idHash(id)
}

// forgetLocked forgets lane's messages at or below floor, its
// consumer's ack floor: no reset redelivers them. Called with sub.mu.
func (s settledLanes) forgetLocked(lane string, floor uint64) {
	ms := s[lane]
	i, _ := slices.BinarySearchFunc(ms, floor+1, func(m settledMsg, seq uint64) int { return cmp.Compare(m.seq, seq) })
	if ms = slices.Delete(ms, 0, i); len(ms) == 0 {
		delete(s, lane)
		return
	}
	s[lane] = ms
}

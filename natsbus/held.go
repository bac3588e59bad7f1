package natsbus

// The held set: what a member pulled and did not settle, in pull order
// (and each partition reader's own, by stream sequence, so that Ack finds
// a lane's lowest unsettled message at once), and hold, which takes a
// pulled message in or drops it as a copy of one held or settled. hold
// runs on a pump; sub.mu guards the set and the readers' pulled
// sequences.

import (
	"errors"
	"iter"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// held is a delivery pulled and not yet settled, allocated with the
// driver.Delivery that carries it as its token.
type held struct {
	d       driver.Delivery
	r       *reader
	seq     uint64        // stream sequence
	msg     jetstream.Msg // the latest delivery of the message: acks and signals go to it
	since   time.Time     // pulled, or last in-progress signal
	first   time.Time     // pulled
	counted bool          // CountRun recorded a run: Ack deletes the record

	prev, next *held // in heldList; nil when not listed
	// In its reader's own list, by stream sequence (partitions' readers
	// only; see reader.first): nil at either end.
	lprev, lnext *held
}

// hold converts msg, just pulled by r, into a delivery and holds it: from
// then on the keeper keeps it in progress, wherever it waits, and Close
// hands it back.
//
// A partition's reader is meant to be its consumer's only reader, so a
// message it pulls at or below the highest sequence it pulled before is
// normally a copy: the server redelivered it (its ack_wait ran out before
// the first in-progress signal, say while it waited in the pull's buffer,
// or its consumer was created again). A copy is not handed to the engine,
// where it would come behind newer messages of the lane: when the
// original is still held, the original takes the copy's message (acks
// and signals then go to the latest delivery); when the reader settled it
// already (the copy crossed the ack), the copy is acknowledged again.
// hold returns nil for a copy. A message handed back with Nack comes again
// as a new delivery. A partition's message whose consumer delivery
// sequence is above the next one expected tells that a delivery never
// reached r (the client dropped it as a slow consumer, or another
// client's pull took it, such as one left by the lane's previous owner):
// hold returns errMissed, and the pump gives the lane up, so that it is
// claimed again from its first message not acknowledged instead of
// getting that delivery back after ack_wait, behind newer messages.
func (s *sub) hold(r *reader, msg jetstream.Msg) (*held, error) {
	md, err := msg.Metadata()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	h := &held{r: r, seq: md.Sequence.Stream, msg: msg, since: now, first: now}
	h.d = driver.Delivery{Lane: r.lane, Position: strconv.FormatUint(h.seq, 10), Attempt: int(md.NumDelivered), Token: h}
	if r.exclusive {
		h.d.Attempt = 0 // a reset restarts the server's count: the group keeps its own (see claim)
	}
	fromMsg(&h.d.Message, msg.Headers(), msg.Data())
	s.mu.Lock()
	if r.exclusive {
		missed := md.Sequence.Consumer > r.dseq+1
		r.dseq = max(r.dseq, md.Sequence.Consumer)
		if missed {
			s.mu.Unlock()
			return nil, errMissed
		}
	}
	switch {
	case !r.exclusive && h.seq <= r.top && (s.held.find(r, h.seq) != nil || r.ackedRecentlyLocked(h.seq)):
		// A second delivery of a message this member holds or has just
		// acknowledged: a server before 2.11 can send a message handed
		// back with Nak twice at once (the redelivery and the stream's
		// next). The original takes the newer delivery, as for a
		// partition's copy; one already acknowledged is acknowledged
		// again. Only sequences at or below the highest pulled are
		// looked up.
		orig := s.held.find(r, h.seq)
		if orig != nil {
			orig.msg, orig.since = msg, now
		}
		s.mu.Unlock()
		if orig == nil {
			_ = msg.Ack()
		}
		return nil, nil
	case !r.exclusive || h.seq > r.top:
		r.pullLocked(h.seq)
		if r.exclusive && s.settled.settledLocked(r.lane, h.seq, h.d.ID) {
			// A reset's redelivery of a message this member handled and
			// acknowledged before it lost the lane and claimed it again
			// (see settled.go): acknowledged again, not handed on.
			r.ackedLocked(h.seq)
			s.mu.Unlock()
			if r.valid(now) {
				_ = msg.Ack()
			}
			return nil, nil
		}
	case hasKey(r.nacked, h.seq):
		delete(r.nacked, h.seq)
	case r.pulledLocked(h.seq):
		orig := s.held.find(r, h.seq)
		if orig != nil {
			orig.msg, orig.since = msg, now
		}
		s.mu.Unlock()
		if orig == nil && r.valid(now) {
			_ = msg.Ack()
		}
		return nil, nil
	}
	s.held.push(h)
	s.mu.Unlock()
	return h, nil
}

// errMissed reports that a partition's reader missed a delivery of its
// consumer: the lane is given up and claimed again, in order.
var errMissed = errors.New("a delivery of the partition's consumer never reached its reader")

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// heldList is the deliveries a member holds, oldest first: an intrusive
// list, so that adding and removing one costs no allocation nor hashing.
// A partition's reader also lists its own by stream sequence (see
// reader.first). The zero value is empty. Guarded by sub.mu.
type heldList struct {
	root held // root.next is the first, root.prev the last
}

func (l *heldList) push(h *held) {
	if l.root.next == nil {
		l.root.next, l.root.prev = &l.root, &l.root
	}
	last := l.root.prev
	h.prev, h.next = last, &l.root
	last.next = h
	l.root.prev = h
	if h.r.exclusive {
		h.r.listLocked(h)
	}
}

// remove unlinks h; false when it was not listed.
func (l *heldList) remove(h *held) bool {
	if h.next == nil {
		return false
	}
	h.prev.next, h.next.prev = h.next, h.prev
	h.prev, h.next = nil, nil
	if h.r.exclusive {
		h.r.unlistLocked(h)
	}
	return true
}

// listLocked adds h to r's deliveries by stream sequence. A partition's
// reader pulls its messages in order, so h normally goes last, at no
// cost; only a message handed back with Nack comes again below newer
// ones. Called with sub.mu.
func (r *reader) listLocked(h *held) {
	at := r.last // h goes after at
	for at != nil && at.seq > h.seq {
		at = at.lprev
	}
	h.lprev = at
	if at == nil {
		h.lnext, r.first = r.first, h
	} else {
		h.lnext, at.lnext = at.lnext, h
	}
	if h.lnext == nil {
		r.last = h
	} else {
		h.lnext.lprev = h
	}
}

// unlistLocked removes h from r's deliveries. Called with sub.mu.
func (r *reader) unlistLocked(h *held) {
	if h.lprev == nil {
		r.first = h.lnext
	} else {
		h.lprev.lnext = h.lnext
	}
	if h.lnext == nil {
		r.last = h.lprev
	} else {
		h.lnext.lprev = h.lprev
	}
	h.lprev, h.lnext = nil, nil
}

// all yields every listed delivery, oldest first; the one yielded may be
// removed.
func (l *heldList) all() iter.Seq[*held] {
	return func(yield func(*held) bool) {
		if l.root.next == nil {
			return
		}
		for h := l.root.next; h != &l.root; {
			next := h.next
			if !yield(h) {
				return
			}
			h = next
		}
	}
}

// find returns r's listed delivery of stream sequence seq, or nil.
func (l *heldList) find(r *reader, seq uint64) *held {
	for h := range l.all() {
		if h.r == r && h.seq == seq {
			return h
		}
	}
	return nil
}

// clear unlinks every delivery.
func (l *heldList) clear() {
	for h := range l.all() {
		l.remove(h)
	}
}

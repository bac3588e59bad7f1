package natsbus

import (
	"iter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// held is a delivery handed out and not yet acknowledged, allocated with
// the driver.Delivery that carries it as its token.
type held struct {
	d     driver.Delivery
	r     *reader
	seq   uint64 // stream sequence
	msg   jetstream.Msg
	since time.Time // received, or last in-progress signal
	first time.Time

	prev, next *held // in heldList; nil when not listed
}

// heldList is the deliveries a member holds, oldest first: an intrusive
// list, so that adding and removing one costs no allocation nor hashing.
// The zero value is empty. Guarded by sub.mu.
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
}

// remove unlinks h; false when it was not listed.
func (l *heldList) remove(h *held) bool {
	if h.next == nil {
		return false
	}
	h.prev.next, h.next.prev = h.next, h.prev
	h.prev, h.next = nil, nil
	return true
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

// clear unlinks every delivery.
func (l *heldList) clear() {
	for h := range l.all() {
		l.remove(h)
	}
}

package natsbus

// The inbox: the bounded queue of items from the pumps to Receive. The
// pumps put, the engine's fetch loop (in Receive) takes; inbox.mu guards
// the items.

import (
	"sync"

	"github.com/omnibus-go/omnibus/driver"
)

type item struct {
	r   *reader
	h   *held
	err error
}

// inboxLen bounds the items waiting between the pumps and Receive.
const inboxLen = 64

// inbox is the bounded queue from a member's pumps to Receive. Items move
// in batches: a pump waits only while the inbox is full and Receive only
// while it is empty, and each side wakes the other once per batch rather
// than once per message.
type inbox struct {
	mu    sync.Mutex
	items []item
	ready chan struct{} // an item arrived in an empty inbox
	space chan struct{} // room appeared in a full inbox
}

func newInbox() *inbox {
	return &inbox{
		items: make([]item, 0, inboxLen),
		ready: make(chan struct{}, 1),
		space: make(chan struct{}, 1),
	}
}

// put adds it, waiting while the inbox is full; false when stop ended
// the wait.
func (q *inbox) put(it item, stop <-chan struct{}) bool {
	for {
		q.mu.Lock()
		if n := len(q.items); n < inboxLen {
			q.items = append(q.items, it)
			if n == 0 {
				driver.Notify(q.ready)
			}
			if n+1 < inboxLen {
				driver.Notify(q.space) // pass the room on to another waiting pump
			}
			q.mu.Unlock()
			return true
		}
		q.mu.Unlock()
		select {
		case <-q.space:
		case <-stop:
			return false
		}
	}
}

// take moves up to max items, oldest first, to the end of buf.
func (q *inbox) take(buf []item, max int) []item {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(max, len(q.items))
	buf = append(buf, q.items[:n]...)
	if len(q.items) == inboxLen && n > 0 {
		driver.Notify(q.space)
	}
	rest := copy(q.items, q.items[n:])
	clear(q.items[rest:])
	q.items = q.items[:rest]
	return buf
}

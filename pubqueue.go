package omnibus

import (
	"sync"
	"time"
)

// pubQueue is one share of a Publisher's topic's keys: the messages
// waiting for a batch, oldest first. Publisher.mu guards it.
//
// Messages wait by value (no allocation per message), already cut into
// the batches they will leave in: push closes a batch when the next
// message would take it past the count or bytes bound, and take hands
// over the first batch's array as it is. A queue cut into batches only
// when they leave copied each batch that spanned two of its chunks, and
// chunk and batch bounds rarely met: with a publisher ahead of Kafka,
// ~350 B allocated and copied a message, the chunk's and the batch's.
type pubQueue struct {
	topic   string
	batches []pubBatch  // the last one open, the others full
	n       int         // messages waiting
	bytes   int         // their sizes
	running bool        // a sender goroutine owns the queue
	timer   *time.Timer // lingering before the sender starts
}

// pubBatch is a batch being filled or waiting to leave.
type pubBatch struct {
	msgs  []outgoing
	bytes int
}

// Batch capacities. A batch opened behind a full one gets an array at
// least as large as that one (the publisher is ahead: the next fills
// too), recycled when one is; one opened in an empty queue starts small
// and grows, so a trickle of messages does not make large arrays. What is left of an array when its batch
// leaves early is the next batch's when small (a trickle reuses it),
// dropped when large, so an idle queue holds no large array.
const (
	batchLeast = 8
	batchKept  = 64
)

// batchArrays holds arrays of batches that are done with (*[]outgoing,
// empty and cleared) for the batches opened behind full ones: a
// publisher ahead of its transport otherwise allocates a batch's array
// a message, ~180 B. Only arrays the transport is done with come back:
// a driver.Queuer's done was called, or a Publish returned (after which
// a driver reads nothing of its messages, even when it returned because
// its ctx ended: driver.Conn.Publish).
var batchArrays sync.Pool

// newBatchArray returns an empty array for at least n messages.
func newBatchArray(n int) []outgoing {
	if a, _ := batchArrays.Get().(*[]outgoing); a != nil && cap(*a) >= n {
		return (*a)[:0]
	}
	// Some room over n: the next batch cut by bytes may hold a few more.
	return make([]outgoing, 0, n+n/8)
}

// dropBatch lets go of a settled batch's messages, once the transport
// is done with them. A batch sharing its array with the queue clears its
// part (the array lives on); one owning it gives it to later batches.
func dropBatch(batch []outgoing, own bool) {
	switch {
	case !own:
		clear(batch)
	case cap(batch) >= batchKept: // a trickle's is not worth keeping
		clear(batch)
		batch = batch[:0]
		batchArrays.Put(&batch)
	}
}

// push appends o to the open batch, or to a new one when o does not fit
// in it: count messages and most bytes at most, a message larger than
// most alone.
func (q *pubQueue) push(o *outgoing, count, most int) {
	last := len(q.batches) - 1
	if last < 0 {
		q.batches = append(q.batches, pubBatch{})
		last = 0
	}
	if b := &q.batches[last]; len(b.msgs) > 0 && (len(b.msgs) == count || b.bytes+o.size > most) {
		q.batches = append(q.batches, pubBatch{msgs: newBatchArray(min(len(b.msgs), count))})
		last++
	}
	b := &q.batches[last]
	if b.msgs == nil {
		b.msgs = make([]outgoing, 0, min(batchLeast, count))
	}
	b.msgs = append(b.msgs, *o)
	b.bytes += o.size
	q.n++
	q.bytes += o.size
}

// take removes the first batch, at least one message, and returns it,
// its bytes, and whether it owns its array (the queue keeps none of it:
// it may be recycled once the batch is done with).
func (q *pubQueue) take() (batch []outgoing, bytes int, own bool) {
	b := q.batches[0]
	batch, own = b.msgs, true
	if len(q.batches) == 1 {
		// The open batch leaves: the room left in its array, if small,
		// is the next one's.
		if rest := b.msgs[len(b.msgs):]; cap(rest) > 0 && cap(rest) <= batchKept {
			batch, own = b.msgs[:len(b.msgs):len(b.msgs)], false
			q.batches[0] = pubBatch{msgs: rest}
		} else {
			q.batches = nil
		}
	} else {
		q.batches[0] = pubBatch{}
		q.batches = q.batches[1:]
	}
	q.n -= len(batch)
	q.bytes -= b.bytes
	return batch, b.bytes, own
}

package omnibus

import "time"

// pubQueue is one share of a Publisher's topic's keys: the messages
// waiting for a batch, oldest first. Publisher.mu guards it.
//
// Messages wait by value (no allocation per message) in chunks rather
// than one slice. One slice taken from its head and appended to at its
// tail is copied whole each time it runs out of room, and a publisher
// running ahead of its transport holds up to its whole buffer there:
// those copies were 15 % of an async publish's CPU on Kafka. A chunk
// is never copied while it fills; a batch is the head of the first
// chunk, or a copy when it spans chunks.
type pubQueue struct {
	topic   string
	chunks  [][]outgoing
	n       int         // messages waiting
	bytes   int         // their sizes
	running bool        // a sender goroutine owns the queue
	timer   *time.Timer // lingering before the sender starts
}

// Chunk capacities: what waits when a chunk is made, within these
// bounds (and never above a batch's count). An emptied last chunk is
// kept for the next messages when small, dropped when large, so that a
// trickle of messages does not make a chunk each and an idle queue holds
// no large array.
const (
	chunkLeast = 8
	chunkKept  = 64
)

// push appends o.
func (q *pubQueue) push(o *outgoing, count int) {
	last := len(q.chunks) - 1
	if last < 0 || len(q.chunks[last]) == cap(q.chunks[last]) {
		q.chunks = append(q.chunks, make([]outgoing, 0, min(max(q.n, chunkLeast), count)))
		last++
	}
	q.chunks[last] = append(q.chunks[last], *o)
	q.n++
	q.bytes += o.size
}

// take removes the next batch from the head: up to count messages and
// up to most bytes, at least one message. It returns the batch and its
// bytes.
func (q *pubQueue) take(count, most int) ([]outgoing, int) {
	n, bytes := 0, 0
	head := q.chunks[0]
fit:
	for _, c := range q.chunks {
		for i := range c {
			if n == count || n > 0 && bytes+c[i].size > most {
				break fit
			}
			bytes += c[i].size
			n++
		}
	}
	var batch []outgoing
	if n <= len(head) {
		batch = head[:n:n]
		q.chunks[0] = head[n:]
		q.dropEmptyHead()
	} else {
		batch = make([]outgoing, 0, n)
		for len(batch) < n {
			c := q.chunks[0]
			k := min(n-len(batch), len(c))
			batch = append(batch, c[:k]...)
			clear(c[:k])
			q.chunks[0] = c[k:]
			q.dropEmptyHead()
		}
	}
	q.n -= n
	q.bytes -= bytes
	return batch, bytes
}

// dropEmptyHead forgets the first chunk once it is empty, unless it is
// the last one, with room left, and small.
func (q *pubQueue) dropEmptyHead() {
	c := q.chunks[0]
	if len(c) > 0 || len(q.chunks) == 1 && cap(c) > 0 && cap(c) <= chunkKept {
		return
	}
	q.chunks[0] = nil
	q.chunks = q.chunks[1:]
	if len(q.chunks) == 0 {
		q.chunks = nil
	}
}

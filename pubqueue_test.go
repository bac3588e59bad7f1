package omnibus

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestPubQueueKeepsOrderAndBounds pushes and takes at random: every
// message comes out once, in the order pushed, in batches within the
// count and bytes bounds (a message larger than the bytes bound alone),
// and the queue's counts match what it holds.
func TestPubQueueKeepsOrderAndBounds(t *testing.T) {
	const count, most = 100, 5000
	rng := rand.New(rand.NewPCG(1, 2))
	var q pubQueue
	pushed, taken, batches := 0, 0, 0
	for pushed < 50_000 || q.n > 0 {
		if pushed < 50_000 && rng.IntN(3) > 0 {
			for range rng.IntN(300) {
				o := outgoing{size: rng.IntN(200)}
				if rng.IntN(1000) == 0 {
					o.size = most + 1
				}
				o.msg.ID = strconv.Itoa(pushed)
				q.push(&o, count, most)
				pushed++
			}
			continue
		}
		if q.n == 0 {
			continue
		}
		batch, bytes, _ := q.take()
		batches++
		sum := 0
		for _, o := range batch {
			if o.msg.ID != strconv.Itoa(taken) {
				t.Fatalf("took %s, want %d", o.msg.ID, taken)
			}
			taken++
			sum += o.size
		}
		if len(batch) == 0 || len(batch) > count || sum != bytes || bytes > most && len(batch) > 1 {
			t.Fatalf("batch of %d, %d bytes (reported %d): out of bounds", len(batch), sum, bytes)
		}
		held := 0
		for _, b := range q.batches {
			held += len(b.msgs)
		}
		if held != q.n {
			t.Fatalf("queue counts %d, holds %d", q.n, held)
		}
	}
	if taken != pushed {
		t.Fatalf("took %d of %d", taken, pushed)
	}
	if len(q.batches) > 1 || len(q.batches) == 1 && cap(q.batches[0].msgs) > batchKept {
		t.Fatalf("an empty queue holds %d batches (the first of capacity %d)", len(q.batches), cap(q.batches[0].msgs))
	}
	t.Logf("%d messages in %d batches", taken, batches)
}

package driver

// Helpers every transport needs besides its own I/O, written once.

import (
	"context"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"time"
)

// Partition returns the partition key lands on in a topic of n
// partitions: FNV-1a of the key, modulo n. Transports without a
// partitioner of their own (membus, natsbus' partitioned mode) use it, so
// that a key lands on the same partition whatever the transport.
func Partition(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// Backoff returns the delay before try number attempt (1-based): first,
// doubling up to most, jittered down by up to half, so that many waiting
// clients do not come back at once.
func Backoff(attempt int, first, most time.Duration) time.Duration {
	d := first
	for i := 1; i < attempt && d < most; i++ {
		d *= 2
	}
	d = min(d, most)
	return d/2 + rand.N(d/2+1)
}

// Notify sends on ch, a channel of capacity 1, without blocking: a wake-up
// that coalesces with one already pending.
func Notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Watch calls check until ctx ends: now, then whenever the time it
// returned comes or a wake-up arrives on wake (see Notify). It is the loop
// of a lease watchdog, whose check gives up the leases whose deadline
// passed and returns the earliest deadline left.
func Watch(ctx context.Context, wake <-chan struct{}, check func(now time.Time) (next time.Time)) {
	t := time.NewTimer(time.Until(check(time.Now())))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		t.Reset(time.Until(check(time.Now())))
	}
}

// Shift takes the first n elements off *buf and returns them in a slice
// of their own: a Receive's hand-out from the buffer its client library
// fills. Their places are cleared, so that the buffer does not keep them
// alive, and a buffer emptied lets its array go.
func Shift[T any](buf *[]T, n int) []T {
	out := make([]T, n)
	copy(out, *buf)
	clear((*buf)[:n])
	*buf = (*buf)[n:]
	if len(*buf) == 0 {
		*buf = nil
	}
	return out
}

// Subscribers is a connection's set of open subscribers and whether the
// connection is closed: the state every Conn keeps so that Close closes
// what is still open and nothing opens after it. The zero value is an
// open connection with no subscriber. Its methods may be called
// concurrently.
type Subscribers[S interface {
	comparable
	Close() error
}] struct {
	mu     sync.Mutex
	closed bool
	subs   map[S]struct{}
}

// Add records s; it returns false, recording nothing, once Close began.
func (c *Subscribers[S]) Add(s S) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	if c.subs == nil {
		c.subs = map[S]struct{}{}
	}
	c.subs[s] = struct{}{}
	return true
}

// Remove forgets s (a subscriber that closed).
func (c *Subscribers[S]) Remove(s S) {
	c.mu.Lock()
	delete(c.subs, s)
	c.mu.Unlock()
}

// All returns the subscribers open now.
func (c *Subscribers[S]) All() []S {
	c.mu.Lock()
	defer c.mu.Unlock()
	subs := make([]S, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	return subs
}

// Closed reports whether Close began.
func (c *Subscribers[S]) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close marks the connection closed and closes every subscriber still
// open, outside the lock. It reports false when Close had begun before:
// the caller's own Close then has nothing more to do.
func (c *Subscribers[S]) Close() bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.closed = true
	subs := make([]S, 0, len(c.subs))
	for s := range c.subs {
		subs = append(subs, s)
	}
	c.subs = nil
	c.mu.Unlock()
	// Outside the lock: a subscriber's Close calls Remove.
	for _, s := range subs {
		_ = s.Close()
	}
	return true
}

// Balance is one member's next step in sharing a group's lanes with the
// other live members by count, KCL-style, for transports whose members
// hold lanes through leases (natsbus's and redisbus's partitioned modes).
// With n live members and N lanes, a member holds at most ceil(N/n);
// while another member holds fewer than floor(N/n), members at floor(N/n)
// or more take no free lane; and when none is free and a member has fewer
// than floor(N/n), the most loaded member (the lowest ID among equals)
// gives one up.
//
// self is the member's ID and members the live members seen (self among
// them or not); owners[i] is lane i's owner as seen ("" when free), and
// mine[i] whether the member holds lane i by its own reckoning. A lane
// whose owner reads as self but that is not mine (given up or lost, its
// release not seen yet) is neither free nor counted. Balance returns the
// free lanes to claim, in random order, and the lane to give up (-1 for
// none), with again set when that lane is above ceil(N/n), so the caller
// goes on at once.
func Balance(self string, members, owners []string, mine []bool) (claim []int, release int, again bool) {
	counts := map[string]int{self: 0}
	for _, m := range members {
		counts[m] += 0
	}
	var free, held []int
	for lane, owner := range owners {
		switch {
		case lane < len(mine) && mine[lane]:
			held = append(held, lane)
			counts[self]++
		case owner == self:
		case owner == "":
			free = append(free, lane)
		default:
			counts[owner]++
		}
	}
	n, lanes := len(counts), len(owners)
	floor, ceil := lanes/n, (lanes+n-1)/n
	have := len(held)
	needy := false // another member holds fewer than its floor
	for id, c := range counts {
		if id != self && c < floor {
			needy = true
		}
	}
	switch {
	case have > ceil:
		return nil, held[len(held)-1], true
	case len(free) > 0:
		limit := ceil
		if needy {
			limit = floor
		}
		rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		return free[:max(0, min(len(free), limit-have))], -1, false
	case needy && have > floor:
		giver := self
		for id, c := range counts {
			if c > counts[giver] || (c == counts[giver] && id < giver) {
				giver = id
			}
		}
		if giver == self {
			return nil, held[len(held)-1], false
		}
	}
	return nil, -1, false
}

// CopyBodies returns copies of msgs' bodies, all in one array (a nil
// body stays nil): what a driver hands its client instead of the
// caller's bodies when the client may read them after Publish returned,
// which Conn.Publish must not let happen.
func CopyBodies(msgs []*Message) [][]byte {
	n := 0
	for _, m := range msgs {
		n += len(m.Body)
	}
	all := make([]byte, 0, n)
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		if m.Body != nil {
			at := len(all)
			all = append(all, m.Body...)
			out[i] = all[at:len(all):len(all)]
		}
	}
	return out
}

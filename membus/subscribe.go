package membus

// Groups and their members: Subscribe joins a group and rebalances it
// (revocations run and finish before claims), Receive reads the owned
// partitions from their committed offsets, Commit moves those, Lag and
// GroupLag read them, Close leaves. Subscribe and Close run on the
// caller's goroutine, Receive on the engine's fetch loop, Commit on its
// settle loop. Lock order: group.rebalance, which serializes membership
// changes and their Lanes calls (made with no lock held), before
// topic.mu, which guards the offsets, the owners and the members'
// positions.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

type group struct {
	name      string
	rebalance sync.Mutex // serializes membership changes and their callbacks
	committed []int64    // guarded by topic.mu
	owner     []*sub     // guarded by topic.mu
	members   []*sub     // guarded by rebalance
	size      int        // len(members), guarded by topic.mu
}

func (c *conn) Subscribe(ctx context.Context, name string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", name); err != nil {
		return nil, err
	}
	t := c.bus.topic(name, c.bus.cfg.Partitions)
	t.mu.Lock()
	g := t.groups[opts.Group]
	if g == nil {
		g = &group{name: opts.Group, committed: make([]int64, len(t.parts)), owner: make([]*sub, len(t.parts))}
		for i, p := range t.parts {
			if opts.StartAt == driver.StartLatest {
				g.committed[i] = int64(len(p.log))
			}
		}
		t.groups[opts.Group] = g
	}
	t.mu.Unlock()
	s := &sub{conn: c, t: t, g: g, lanes: opts.Lanes, pos: map[int]int64{}, revoking: map[int]bool{}, wake: make(chan struct{}, 1)}
	if !c.subs.Add(s) {
		return nil, fmt.Errorf("membus: subscribe %q: %w", name, driver.ErrClosed)
	}
	g.rebalance.Lock()
	g.members = append(g.members, s)
	t.mu.Lock()
	g.size = len(g.members)
	t.mu.Unlock()
	t.rebalance(ctx, g)
	g.rebalance.Unlock()
	return s, nil
}

// rebalance spreads the partitions evenly over the group's members,
// moving as few as it can: revocations run (and finish) before claims.
// The caller holds g.rebalance.
func (t *topic) rebalance(ctx context.Context, g *group) {
	t.mu.Lock()
	n := len(t.parts)
	want := make([]*sub, n)
	count := map[*sub]int{}
	members := g.members
	if len(members) > 0 {
		quota := func(i int) int { // members earlier in the list take the remainder
			q := n / len(members)
			if i < n%len(members) {
				q++
			}
			return q
		}
		index := map[*sub]int{}
		for i, s := range members {
			index[s] = i
		}
		for p, s := range g.owner { // keep owners up to their quota
			if i, ok := index[s]; ok && count[s] < quota(i) {
				want[p] = s
				count[s]++
			}
		}
		next := 0
		for p := range want {
			for want[p] == nil {
				if s := members[next]; count[s] < quota(next) {
					want[p] = s
					count[s]++
				}
				next = (next + 1) % len(members)
			}
		}
	}
	revoke := map[*sub][]int{}
	claim := map[*sub][]int{}
	for p := range n {
		if old := g.owner[p]; old != want[p] {
			if old != nil {
				revoke[old] = append(revoke[old], p)
			}
			if want[p] != nil {
				claim[want[p]] = append(claim[want[p]], p)
			}
		}
	}
	t.mu.Unlock()

	for s, ps := range revoke {
		// A Receive in progress returns at once, so the engine can
		// dispatch what it read before the partitions go.
		t.mu.Lock()
		for _, p := range ps {
			s.revoking[p] = true
		}
		t.mu.Unlock()
		driver.Notify(s.wake)
		s.lanes.Revoked(ctx, t.lanes(ps))
		t.mu.Lock()
		for _, p := range ps {
			g.owner[p] = nil
			delete(s.pos, p)
			delete(s.revoking, p)
		}
		t.mu.Unlock()
	}
	for s, ps := range claim {
		t.mu.Lock()
		for _, p := range ps {
			g.owner[p] = s
		}
		t.mu.Unlock()
		s.lanes.Claimed(t.lanes(ps))
		t.mu.Lock()
		for _, p := range ps {
			s.pos[p] = g.committed[p]
		}
		t.mu.Unlock()
		driver.Notify(s.wake)
	}
}

func (t *topic) lanes(ps []int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ls := make([]string, len(ps))
	for i, p := range ps {
		ls[i] = t.parts[p].lane
	}
	return ls
}

// sub is one group member.
type sub struct {
	conn  *conn
	t     *topic
	g     *group
	lanes driver.Lanes
	wake  chan struct{}

	// guarded by t.mu
	pos      map[int]int64 // owned partition -> next offset to read
	next     int           // round-robin start over owned partitions
	closed   bool
	revoking map[int]bool // partitions being revoked: Receive skips them

	closeOnce sync.Once
}

func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	t := s.t
	for {
		t.mu.Lock()
		if s.closed {
			t.mu.Unlock()
			return nil, fmt.Errorf("membus: receive %q: %w", t.name, driver.ErrClosed)
		}
		var ds []*driver.Delivery
		owned := slices.DeleteFunc(slices.Sorted(maps.Keys(s.pos)), func(p int) bool { return s.revoking[p] })
		bytes, full := 0, false
		// The partitions take turns: each an equal share of the room, so
		// a backlog on one does not keep the others waiting.
		quota := int64(max(1, (room.Count+len(owned)-1)/max(len(owned), 1)))
		for i := 0; i < len(owned) && !full; i++ {
			p := owned[(s.next+i)%len(owned)]
			log, from := t.parts[p].log, s.pos[p]
			for off := from; off < int64(len(log)) && off < from+quota; off++ {
				r := &log[off]
				size := r.msg.Size()
				if full = !room.Fits(len(ds), bytes, size); full {
					break
				}
				bytes += size
				ds = append(ds, &driver.Delivery{
					Message:  r.msg,
					Lane:     t.parts[p].lane,
					Position: r.pos,
					Token:    r, // records never change once appended
				})
				s.pos[p] = off + 1
			}
		}
		s.next++
		notify := t.notify
		t.mu.Unlock()
		if len(ds) > 0 || full {
			return ds, nil
		}
		select {
		case <-notify:
		case <-s.wake:
			return nil, nil // a revocation waits for this Receive
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Wake implements driver.Waker: the Receive in progress returns empty.
func (s *sub) Wake() { driver.Notify(s.wake) }

// Commit implements driver.Committer.
func (s *sub) Commit(_ context.Context, ds []*driver.Delivery) error {
	t := s.t
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for _, d := range ds {
		p, err := strconv.Atoi(d.Lane)
		if err != nil || p >= len(t.parts) {
			errs = append(errs, fmt.Errorf("membus: commit %q: unknown lane %q: %w", t.name, d.Lane, driver.ErrInvalid))
			continue
		}
		if t.groups[s.g.name] != s.g || s.g.owner[p] != s {
			errs = append(errs, fmt.Errorf("membus: commit %q partition %d: %w", t.name, p, ErrNotOwner))
			continue
		}
		s.g.committed[p] = d.Token.(*record).off + 1
	}
	return errors.Join(errs...)
}

// ErrNotOwner is returned for a commit on a partition the member does not
// own (any more).
var ErrNotOwner = errors.New("partition not owned by this member")

// Lag implements driver.LagReader: end offset minus committed offset for
// every partition of the topic.
func (s *sub) Lag(context.Context) ([]driver.LaneLag, error) {
	now := s.conn.bus.cfg.Clock()
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.t.lagLocked(s.g, now), nil
}

// lagLocked is the group's lag on every partition: the records after the
// committed offset, and the age of the first of them at now.
func (t *topic) lagLocked(g *group, now time.Time) []driver.LaneLag {
	lags := make([]driver.LaneLag, len(t.parts))
	for p, part := range t.parts {
		at := g.committed[p]
		l := driver.LaneLag{Lane: part.lane, Lag: int64(len(part.log)) - at, Known: true, Committed: at, AgeKnown: true}
		if at < int64(len(part.log)) {
			l.SetAge(now, part.log[at].at)
		}
		lags[p] = l
	}
	return lags
}

// GroupLag implements driver.GroupLagReader.
func (c *conn) GroupLag(_ context.Context, topic, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	c.bus.mu.Lock()
	t := c.bus.topics[topic]
	c.bus.mu.Unlock()
	if t == nil {
		return nil, fmt.Errorf("membus: lag: topic %q: %w", topic, driver.ErrNotFound)
	}
	now := c.bus.cfg.Clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.groups[group]
	if g == nil {
		return nil, fmt.Errorf("membus: lag: group %q of topic %q: %w", group, topic, driver.ErrNotFound)
	}
	return t.lagLocked(g, now), nil
}

// GroupMembers implements driver.GroupMembersReader: the members of group
// on topic, in every client of the bus.
func (c *conn) GroupMembers(_ context.Context, topic, name string) (int, error) {
	if err := c.checkOpen("members", topic); err != nil {
		return 0, err
	}
	c.bus.mu.Lock()
	t := c.bus.topics[topic]
	c.bus.mu.Unlock()
	if t == nil {
		return 0, fmt.Errorf("membus: members: topic %q: %w", topic, driver.ErrNotFound)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.groups[name]
	if g == nil {
		return 0, fmt.Errorf("membus: members: group %q of topic %q: %w", name, topic, driver.ErrNotFound)
	}
	return g.size, nil
}

// Close implements driver.Subscriber: the member revokes its own
// partitions (committing through its engine) and leaves the group.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		g := s.g
		g.rebalance.Lock()
		defer g.rebalance.Unlock()
		g.members = slices.DeleteFunc(g.members, func(x *sub) bool { return x == s })
		s.t.mu.Lock()
		g.size = len(g.members)
		s.t.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s.t.rebalance(ctx, g)
		s.t.mu.Lock()
		s.closed = true
		s.t.mu.Unlock()
		driver.Notify(s.wake)
		s.conn.subs.Remove(s)
	})
	return nil
}

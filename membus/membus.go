package membus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Scheme is the URL scheme membus registers.
const Scheme = "mem"

// Defaults of the URL parameters.
const (
	DefaultPartitions = 4
	DefaultMaxBytes   = 8 << 20
)

func init() { omnibus.Register(Scheme, opener{}) }

type opener struct{}

var (
	busesMu sync.Mutex
	buses   = map[string]*Bus{}
)

// Open implements driver.Driver.
func (opener) Open(_ context.Context, u *url.URL, _ driver.OpenOptions) (driver.Conn, error) {
	if err := driver.CheckParams(u, "partitions", "max_bytes"); err != nil {
		return nil, fmt.Errorf("membus: %w", err)
	}
	cfg := Config{Partitions: DefaultPartitions, MaxBytes: DefaultMaxBytes}
	q := u.Query()
	for name, dst := range map[string]*int{"partitions": &cfg.Partitions, "max_bytes": &cfg.MaxBytes} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("membus: URL %q: %s=%q, want a positive integer: %w", omnibus.RedactURL(u.String()), name, v, driver.ErrInvalid)
			}
			*dst = n
		}
	}
	name := u.Host + u.Path // omnibus.Open refuses opaque URLs (mem:name)
	if name == "" {
		name = "default"
	}
	busesMu.Lock()
	defer busesMu.Unlock()
	b := buses[name]
	if b == nil {
		b = New(cfg)
		b.name = name
		buses[name] = b
	}
	b.refs++
	return &conn{bus: b}, nil
}

// Config configures a Bus.
type Config struct {
	// Partitions is the number of partitions of a topic created on first
	// use. Default: 4.
	Partitions int
	// MaxBytes is the largest message accepted. Default: 8 MiB.
	MaxBytes int
}

// Bus is one in-memory log: topics, partitions, groups and offsets.
type Bus struct {
	cfg  Config
	name string // registered name, "" when private
	refs int    // open conns, guarded by busesMu

	mu     sync.Mutex
	topics map[string]*topic
}

// New returns a private bus. Pass it to omnibus.New through Conn.
func New(cfg Config) *Bus {
	if cfg.Partitions <= 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	return &Bus{cfg: cfg, topics: map[string]*topic{}}
}

// Conn returns a driver connection to the bus, for omnibus.New.
func (b *Bus) Conn() driver.Conn { return &conn{bus: b} }

type topic struct {
	name string

	mu     sync.Mutex
	parts  []*partition
	groups map[string]*group
	notify chan struct{} // closed and replaced on every append
	rr     atomic.Uint64
}

type partition struct {
	lane string
	log  []record
}

type record struct {
	msg driver.Message
}

type group struct {
	name      string
	rebalance sync.Mutex // serializes membership changes and their callbacks
	committed []int64    // guarded by topic.mu
	owner     []*sub     // guarded by topic.mu
	members   []*sub     // guarded by rebalance
}

func (b *Bus) topic(name string, partitions int) *topic {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.topics[name]
	if t == nil {
		t = &topic{name: name, groups: map[string]*group{}, notify: make(chan struct{})}
		b.topics[name] = t
	}
	t.mu.Lock()
	t.growLocked(partitions)
	t.mu.Unlock()
	return t
}

func (t *topic) growLocked(n int) {
	for i := len(t.parts); i < n; i++ {
		t.parts = append(t.parts, &partition{lane: strconv.Itoa(i)})
		for _, g := range t.groups {
			g.committed = append(g.committed, 0)
			g.owner = append(g.owner, nil)
		}
	}
}

type conn struct {
	bus  *Bus
	subs driver.Subscribers[*sub]
}

func (c *conn) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Ordered:         true,
		Lag:             driver.LagRecords,
		ExclusiveLanes:  true,
		Groups:          true,
		Replay:          true,
		MaxMessageBytes: c.bus.cfg.MaxBytes,
	}
}

func (c *conn) checkOpen(op, topic string) error {
	if c.subs.Closed() {
		return fmt.Errorf("membus: %s %q: %w", op, topic, driver.ErrClosed)
	}
	return nil
}

// CreateTopic implements driver.TopicCreator: it grows the topic to n
// partitions.
func (c *conn) CreateTopic(_ context.Context, name string, n int) error {
	if err := c.checkOpen("create topic", name); err != nil {
		return err
	}
	t := c.bus.topic(name, n)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.parts) != n {
		return nil // never shrinks, like Kafka
	}
	return nil
}

func (c *conn) Publish(ctx context.Context, name string, msgs []*driver.Message, _ driver.PublishOptions) error {
	if err := c.checkOpen("publish", name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t := c.bus.topic(name, c.bus.cfg.Partitions)
	var errs []error
	recs := make([]record, len(msgs))
	for i, m := range msgs {
		if n := m.Size(); n > c.bus.cfg.MaxBytes {
			if errs == nil {
				errs = make([]error, len(msgs))
			}
			errs[i] = fmt.Errorf("membus: publish %q: message %q is %d bytes, limit %d: %w", name, m.ID, n, c.bus.cfg.MaxBytes, driver.ErrTooLarge)
			continue
		}
		recs[i] = record{msg: *m}
		recs[i].msg.Body = slices.Clone(m.Body)
		if m.Headers != nil {
			recs[i].msg.Headers = maps.Clone(m.Headers)
		}
	}
	t.mu.Lock()
	n := len(t.parts)
	for i := range recs {
		if errs != nil && errs[i] != nil {
			continue
		}
		p := t.parts[t.partitionLocked(recs[i].msg.Key, n)]
		p.log = append(p.log, recs[i])
	}
	close(t.notify)
	t.notify = make(chan struct{})
	t.mu.Unlock()
	if errs != nil {
		return &driver.MessageErrors{Errs: errs}
	}
	return nil
}

func (t *topic) partitionLocked(key string, n int) int {
	if key == "" {
		return int(t.rr.Add(1) % uint64(n))
	}
	return driver.Partition(key, n)
}

// Partition returns the partition a key lands on in a topic of n
// partitions (driver.Partition: FNV-1a); empty keys are spread
// round-robin instead.
func Partition(key string, n int) int { return driver.Partition(key, n) }

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

func (c *conn) Close() error {
	if !c.subs.Close() {
		return nil
	}
	if c.bus.name != "" {
		busesMu.Lock()
		c.bus.refs--
		if c.bus.refs == 0 && buses[c.bus.name] == c.bus {
			delete(buses, c.bus.name)
		}
		busesMu.Unlock()
	}
	return nil
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
		for i := 0; i < len(owned) && !full; i++ {
			p := owned[(s.next+i)%len(owned)]
			log := t.parts[p].log
			for off := s.pos[p]; off < int64(len(log)); off++ {
				r := &log[off]
				size := r.msg.Size()
				if full = !room.Fits(len(ds), bytes, size); full {
					break
				}
				bytes += size
				ds = append(ds, &driver.Delivery{
					Message:  r.msg,
					Lane:     t.parts[p].lane,
					Position: strconv.FormatInt(off, 10),
					Token:    off,
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
		s.g.committed[p] = d.Token.(int64) + 1
	}
	return errors.Join(errs...)
}

// ErrNotOwner is returned for a commit on a partition the member does not
// own (any more).
var ErrNotOwner = errors.New("partition not owned by this member")

// Lag implements driver.LagReader: end offset minus committed offset for
// every partition of the topic.
func (s *sub) Lag(context.Context) ([]driver.LaneLag, error) {
	s.t.mu.Lock()
	defer s.t.mu.Unlock()
	return s.t.lagLocked(s.g), nil
}

func (t *topic) lagLocked(g *group) []driver.LaneLag {
	lags := make([]driver.LaneLag, len(t.parts))
	for p, part := range t.parts {
		lags[p] = driver.LaneLag{Lane: part.lane, Lag: int64(len(part.log)) - g.committed[p], Known: true}
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
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.groups[group]
	if g == nil {
		return nil, fmt.Errorf("membus: lag: group %q of topic %q: %w", group, topic, driver.ErrNotFound)
	}
	return t.lagLocked(g), nil
}

// Close implements driver.Subscriber: the member revokes its own
// partitions (committing through its engine) and leaves the group.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		g := s.g
		g.rebalance.Lock()
		defer g.rebalance.Unlock()
		g.members = slices.DeleteFunc(g.members, func(x *sub) bool { return x == s })
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

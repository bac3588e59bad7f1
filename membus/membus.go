package membus

// The bus: the registry of named buses (busesMu guards it and their
// reference counts), a bus's topics and their partitioned logs, the
// connection, and Publish, which appends to the logs and wakes the
// readers. It runs on the caller's goroutine; Bus.mu guards the topics,
// topic.mu a topic's partitions, groups and notify channel. Groups and
// their members are in subscribe.go.

import (
	"context"
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
	// Clock tells the time: records are stamped with it when appended,
	// and a lane's age (driver.LaneLag.Age) is measured with it. Tests
	// of time lag give a fake one. Default: time.Now.
	Clock func() time.Time
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
	if cfg.Clock == nil {
		cfg.Clock = time.Now
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
	off int64     // the record's offset in its partition
	pos string    // off in decimal: every delivery of the record shares it
	at  time.Time // appended, by Config.Clock
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
		Age:             true,
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

// CreateTopic implements driver.TopicCreator: it creates the topic, or
// grows it to n partitions (it never shrinks, like Kafka).
func (c *conn) CreateTopic(_ context.Context, name string, n int) error {
	if err := c.checkOpen("create topic", name); err != nil {
		return err
	}
	c.bus.topic(name, n)
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
	now := c.bus.cfg.Clock()
	for i := range recs {
		if errs != nil && errs[i] != nil {
			continue
		}
		recs[i].at = now
		p := t.parts[t.partitionLocked(recs[i].msg.Key, n)]
		recs[i].off = int64(len(p.log))
		recs[i].pos = strconv.FormatInt(recs[i].off, 10)
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

package rabbitbus

// Subscribing: a group member (sub) and its lanes, Subscribe, the
// partitioned member's face (partSub, without Nack) and Close, which
// revokes the lanes it holds and closes their channels. Subscribe and
// Close run on the caller's goroutine. Lock order: cbMu, ackMu, mu (see
// sub).

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// sub is one group member.
//
// Goroutines, all owned by the sub and ended by Close: one per lane (it
// opens the lane's channel, declares the lane's topology, consumes, and
// reopens after a drop), and in partitioned mode the rebalancer and,
// for a named group, the tail of its run records (runs.go).
//
// Locks: cbMu serializes Claimed and Revoked and is never taken by
// Receive or Ack (Lost is called without it, so that a lost channel
// reaches the engine at once, not behind another lane's drain); ackMu
// serializes acknowledgement plans and sends (a multiple ack must not
// overtake a single ack of a tag it covers); mu guards the buffer and the
// lanes' channel state. Order: cbMu, ackMu, mu.
type sub struct {
	c        *conn
	link     *link
	topic    string
	group    string
	expires  bool // a throwaway group: its queues go when unused
	part     bool
	quorum   bool
	cb       driver.Lanes
	prefetch int
	lanes    []*lane
	runs     *runs // a partitioned group's run records; nil for a throwaway group or unpartitioned

	cbMu  sync.Mutex
	ackMu sync.Mutex

	mu   sync.Mutex
	buf  []*driver.Delivery // deliveries of claimed lanes that are not being revoked
	wake chan struct{}
	// revokes counts the starts and ends of Revoked and Lost calls, seen
	// its value when Receive last returned: Receive returns once with
	// nothing each time a revocation starts (the engine waits for a
	// Receive in progress before it revokes, and an idle member's Receive
	// would otherwise hold the revocation for the engine's whole drain
	// bound) and each time one ends (so that a Receive begun before the
	// engine marked the lanes revoked never returns a new claim's
	// deliveries, which the engine would drop). Otherwise it goes on
	// returning the deliveries of the lanes that stay.
	revokes uint64
	seen    uint64
	closed  bool

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// lane is one queue the member consumes, on a channel of its own.
type lane struct {
	s     *sub
	n     int
	id    string
	queue string

	// guarded by s.mu
	ch       *amqp.Channel // nil while down
	gen      uint64        // counts channels
	claimed  bool
	revoking bool
	held     int         // deliveries on ch not yet acknowledged
	low      uint64      // lowest delivery tag on ch not known settled
	settled  []bool      // settled[i] is tag low+i
	times    []time.Time // times[i] is tag low+i's message time, for the lane's age
}

// token is a Delivery's handle.
type token struct {
	l   *lane
	gen uint64
	tag uint64
	run string // the delivery's key in the group's run records once counted (guarded by s.mu)
}

// Subscribe implements driver.Conn.
func (c *conn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	if topic == "" || opts.Group == "" || len(topic)+len(opts.Group)+32 > 255 {
		return nil, fmt.Errorf("rabbitbus: subscribe %q group %q: topic and group must be non-empty and their names together under 224 bytes: %w", topic, opts.Group, driver.ErrInvalid)
	}
	if opts.StartAt == driver.StartEarliest {
		return nil, fmt.Errorf("rabbitbus: subscribe %q: a new group cannot start from the earliest message: %w", topic, driver.ErrUnsupported)
	}
	l, err := c.subLink(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitbus: subscribe %q: %w", topic, err)
	}
	kept := c.kept(topic, opts.Group)
	s := &sub{
		c: c, link: l, topic: topic, group: opts.Group, expires: opts.Ephemeral && !kept,
		part: c.cfg.partitions > 0 && !kept, quorum: c.cfg.quorum(),
		cb: opts.Lanes, prefetch: max(1, min(opts.MaxInFlight, math.MaxUint16)),
		wake: make(chan struct{}, 1),
	}
	if s.part {
		// Ordered lanes retry in place: the messages a retrying key holds
		// must not use up the prefetch the lane's other keys need.
		s.prefetch = max(s.prefetch, min(opts.MaxHeld, math.MaxUint16))
	}
	if s.part {
		for p := range c.cfg.partitions {
			s.lanes = append(s.lanes, &lane{s: s, n: p, id: strconv.Itoa(p), queue: partitionQueue(topic, opts.Group, p)})
		}
	} else {
		s.lanes = []*lane{{s: s, id: "0", queue: c.groupQueues(topic, opts.Group)[0]}}
	}
	if s.part && !s.expires {
		s.runs = newRuns(s)
	}
	// Declare everything once, in lane order (the consistent-hash
	// exchange assigns its buckets in binding order).
	if _, err := c.withChannel(ctx, l, func(ch *amqp.Channel) error {
		for _, ln := range s.lanes {
			if err := ln.declare(ch); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, c.topologyError("subscribe", topic, err)
	}
	if s.runs != nil {
		// On a channel of its own: a server without stream queues
		// (before 3.9, or with the stream_queue feature flag off)
		// refuses the declaration, and the group then counts
		// deliveries, as it did before run counts.
		_, err := c.withChannel(ctx, l, func(ch *amqp.Channel) error {
			c.record("q", s.runs.queue)
			return declareRuns(ch, s.runs.queue)
		})
		switch {
		case err == nil:
		case connectionLost(err) || ctx.Err() != nil:
			return nil, c.topologyError("subscribe", topic, err)
		default:
			c.log.Warn("the group's stream of run records cannot be declared: a message held by a member that crashed on another is counted as run",
				"topic", topic, "group", opts.Group, "queue", s.runs.queue, "err", err)
			s.runs = nil
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if !c.subs.Add(s) {
		s.cancel()
		return nil, fmt.Errorf("rabbitbus: subscribe %q: %w", topic, driver.ErrClosed)
	}
	for _, ln := range s.lanes {
		s.wg.Add(1)
		go ln.run()
	}
	if s.part {
		s.wg.Add(1)
		go s.rebalance()
	}
	if s.runs != nil {
		s.wg.Add(1)
		go s.runs.tail()
		return countingSub{partSub{s}}, nil
	}
	if s.part {
		return &partSub{s}, nil
	}
	return s, nil
}

// partSub is a partitioned-mode member. It has no Nack: a redelivery
// through a retry queue would land behind later messages of its key, so
// the engine retries in place instead.
type partSub struct{ s *sub }

func (p partSub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	return p.s.Receive(ctx, room)
}
func (p partSub) Ack(ctx context.Context, ds []*driver.Delivery) error { return p.s.Ack(ctx, ds) }
func (p partSub) Lag(ctx context.Context) ([]driver.LaneLag, error)    { return p.s.Lag(ctx) }
func (p partSub) Close() error                                         { return p.s.Close() }
func (p partSub) Wake()                                                { p.s.Wake() }

var (
	_ driver.Acker     = (*sub)(nil)
	_ driver.Nacker    = (*sub)(nil)
	_ driver.LagReader = (*sub)(nil)
	_ driver.Waker     = (*sub)(nil)
	_ driver.Acker     = partSub{}
	_ driver.LagReader = partSub{}
	_ driver.Waker     = partSub{}
)

// Close implements driver.Subscriber: it revokes the lanes it holds,
// then closes their channels, so the server requeues what is
// unacknowledged and, in partitioned mode, activates the next member.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		s.cbMu.Lock()
		s.mu.Lock()
		var ids []string
		for _, l := range s.lanes {
			if l.claimed && !l.revoking {
				l.claimed, l.revoking = false, true
				ids = append(ids, l.id)
			}
		}
		s.buf = nil // unacknowledged: the server requeues them with the channels
		s.mu.Unlock()
		if len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			s.revoke(func() { s.cb.Revoked(ctx, ids) })
			cancel()
		}
		s.mu.Lock()
		s.closed = true
		s.buf = nil
		var chans []*amqp.Channel
		for _, l := range s.lanes {
			if l.ch != nil {
				chans = append(chans, l.ch)
			}
		}
		s.mu.Unlock()
		s.cbMu.Unlock()
		driver.Notify(s.wake)
		s.cancel()
		for _, ch := range chans {
			_ = ch.Close()
		}
		s.wg.Wait()
		s.c.subs.Remove(s)
	})
	return nil
}

package redisbus

// Subscribing: a group member (sub), joining a group (its consumer
// group on each of the topic's streams) and leaving it: Close hands back
// at once what the member did not settle (unpartitioned) or releases its
// leases (partitioned). Subscribe and Close run on the caller's
// goroutine; sub.mu guards the lanes and the held set.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Subscribe implements driver.Conn: it creates the group on the topic's
// streams where it does not exist (at the stream's end, or its start with
// StartEarliest) and joins it as a consumer named after the connection
// and a new member ID. On an unpartitioned topic the member reads the
// one stream with the others, competing for its entries; on a
// partitioned one it reads the partitions whose leases it holds (see
// partition.go).
func (c *conn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	parts, err := c.layout(ctx, topic)
	if err != nil {
		return nil, err
	}
	s := newSub(c, topic, parts, opts)
	fail := func(err error) (driver.Subscriber, error) {
		s.cancel()
		_ = s.rd.Close()
		return nil, fmt.Errorf("redisbus: subscribe %q group %q: %w", topic, opts.Group, err)
	}
	start := "$"
	if opts.StartAt == driver.StartEarliest {
		start = "0"
	}
	for p, stream := range s.streams() {
		l := &lane{id: laneID(p), stream: stream}
		if err := c.join(ctx, topic, stream, s.field(l), opts.Group, start); err != nil {
			return fail(err)
		}
		s.record(ctx, l)
	}
	if err := c.addSub(s); err != nil {
		return fail(err)
	}
	if opts.Ephemeral {
		c.joinEphemeral(topic, opts.Group)
	}
	if parts == 0 {
		l := &lane{id: unorderedLane, stream: topic}
		s.lanes[l.id] = l
		if err := s.heartbeat(ctx, c.cfg.claimIdle); err != nil {
			s.abort()
			return fail(err)
		}
		opts.Lanes.Claimed([]string{l.id})
		l.off.Store(false)
		s.wg.Add(2)
		go s.readLoop()
		go s.keepLoop()
		return s, nil
	}
	s.part = newPartitioned(s)
	if err := s.part.start(ctx); err != nil {
		s.abort()
		return fail(err)
	}
	s.wg.Add(1)
	go s.readLoop()
	return s, nil
}

// sub is one group member: a consumer of the group on each stream it
// reads.
//
// Goroutines: the reader (reads for Receive, on a connection of its
// own), and, unpartitioned, the keeper (keeps held entries from being
// claimed, heartbeat, claims left by others); partitioned, the lease
// goroutines (see partitioned). All end in Close.
type sub struct {
	c        *conn
	topic    string
	parts    int // 0: unpartitioned
	group    string
	consumer string // the member's consumer name, also its ID in leases
	opts     driver.SubscribeOptions
	part     *partitioned // nil on an unpartitioned topic

	rd       *redis.Client // the reader's connection
	readerID atomic.Int64  // its CLIENT ID, to unblock a blocking read

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error // Close's result

	want       chan int        // Receive asks the reader for a read of so many entries
	results    chan readResult // the reader's answer
	wake       chan struct{}   // a lane is going: a Receive in progress returns
	kick       chan struct{}   // the lanes changed: the reader looks again
	readerDone chan struct{}   // closed when the reader ends

	// Receive's own: calls never overlap.
	asked bool
	carry []*driver.Delivery
	size  int // the mean size of the last read's entries

	mu    sync.Mutex
	lanes map[string]*lane    // the lanes the member holds
	held  map[string]struct{} // unpartitioned: IDs read and not yet acknowledged
}

// lane is a stream the member reads: the topic's one stream, or a
// partition it holds the lease of.
type lane struct {
	id     string
	part   int
	stream string
	lease  string // lease key; "" unpartitioned
	token  string // the lease's value under this claim

	// off is set when the lane stops delivering (revoking, lost or
	// released); gone when it stops acknowledging too.
	off  atomic.Bool
	gone atomic.Bool

	// The reader's own.
	cursor string // where taking over the lane's pending entries goes on ("" when done)
	last   string // the newest entry read
	after  string // the ID a blocking read waits after

	// Guarded by sub.mu.
	reack     []string  // settled entries whose acknowledgement failed: sent with the next
	deadline  time.Time // the lease is ours until then, unless renewed
	claimed   bool      // Lanes.Claimed returned
	releasing bool      // release owns it from here on
	revoke    func()    // ends release's Revoked early: set while it runs
	lost      bool      // the lease ran out or was taken
}

func newSub(c *conn, topic string, parts int, opts driver.SubscribeOptions) *sub {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sub{
		c: c, topic: topic, parts: parts, group: opts.Group, opts: opts,
		consumer: c.cfg.name + "-" + omnibus.NewID(),
		ctx:      ctx, cancel: cancel,
		want:       make(chan int, 1),
		results:    make(chan readResult, 1),
		wake:       make(chan struct{}, 1),
		kick:       make(chan struct{}, 1),
		readerDone: make(chan struct{}),
		lanes:      map[string]*lane{},
		held:       map[string]struct{}{},
	}
	o := c.cfg.options()
	o.PoolSize, o.MinIdleConns = 1, 0
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		id, err := cn.ClientID(ctx).Result()
		if err == nil {
			s.readerID.Store(id)
		}
		return err
	}
	s.rd = redis.NewClient(o)
	return s
}

// streams are the streams of the topic.
func (s *sub) streams() []string { return streamsOf(s.topic, s.parts) }

// laneID is the lane of partition part.
func laneID(part int) string { return strconv.Itoa(part) }

// heartbeat records the member as alive for ttl in the group's set of
// members (0: removes it).
func (s *sub) heartbeat(ctx context.Context, ttl time.Duration) error {
	err := heartbeatScript.Run(ctx, s.c.rdb, []string{membersKey(s.topic, s.group)}, s.consumer, ttl.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("heartbeat: %w", classify(err))
	}
	return nil
}

// unblock makes a blocking read of the reader return at once.
func (s *sub) unblock() {
	if id := s.readerID.Load(); id > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.c.rdb.ClientUnblock(ctx, id).Err()
		cancel()
	}
}

// abort undoes the registration of a Subscribe that failed after
// addSub.
func (s *sub) abort() {
	s.c.subs.Remove(s)
	if s.opts.Ephemeral {
		s.c.leaveEphemeral(s.topic, s.group)
	}
}

// Wake implements driver.Waker: the Receive in progress returns empty.
func (s *sub) Wake() { driver.Notify(s.wake) }

// Close implements driver.Subscriber: it stops reading and leaves the
// group. An unpartitioned member hands back at once everything it read
// and did not acknowledge (its idle time set to claim_idle, so the next
// claim of any member takes it) and deletes its consumer when nothing is
// pending for it. A partitioned member releases its leases; the next
// owner of each lane takes over what it left pending. A throwaway
// group's last member on the connection destroys the group and its keys.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		if s.part != nil {
			s.part.stop()
		}
		// End a blocking read cleanly (closing the connection under it
		// makes go-redis log), then close the reader's connection, which
		// ends one begun meanwhile.
		s.unblock()
		select {
		case <-s.readerDone:
		case <-time.After(100 * time.Millisecond):
		}
		_ = s.rd.Close()
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// Settled entries whose acknowledgement failed: a last try, and
		// an error when it fails too (they go back to the group).
		if n, err := s.flushAcks(ctx); err != nil {
			s.closeErr = fmt.Errorf("redisbus: %d settled entries of %q group %q could not be acknowledged and will be delivered again: %w",
				n, s.topic, s.group, err)
		}
		if s.part != nil {
			s.part.leave(ctx)
		} else {
			s.handBack(ctx)
			s.record(ctx, s.lane(unorderedLane))
		}
		_ = s.heartbeat(ctx, 0)
		for _, stream := range s.streams() {
			_ = delConsumerScript.Run(ctx, s.c.rdb, []string{stream}, s.group, s.consumer).Err()
		}
		if s.opts.Ephemeral && s.c.leaveEphemeral(s.topic, s.group) {
			_ = s.c.destroyGroup(ctx, s.topic, s.parts, s.group)
		}
		s.c.subs.Remove(s)
	})
	return s.closeErr
}

// flushAcks acknowledges the settled entries whose acknowledgement
// failed before, and returns how many there were and the error of the
// try.
func (s *sub) flushAcks(ctx context.Context) (int, error) {
	n := 0
	s.mu.Lock()
	for _, l := range s.lanes {
		n += len(l.reack)
	}
	s.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	return n, s.Ack(ctx, nil)
}

// destroyGroup removes group from topic's streams, with its keys: its
// members, fencing counter, positions, run counts and leases.
func (c *conn) destroyGroup(ctx context.Context, topic string, parts int, group string) error {
	streams := streamsOf(topic, parts)
	keys := append(streams[:len(streams):len(streams)], positionsKey(topic), membersKey(topic, group), fenceKey(topic, group))
	args := []any{group, len(streams)}
	for p, stream := range streams {
		args = append(args, positionField(group, laneID(p), parts > 0))
		keys = append(keys, runsKey(stream, group))
		if parts > 0 {
			keys = append(keys, leaseKey(stream, group))
		}
	}
	return destroyScript.Run(ctx, c.rdb, keys, args...).Err()
}

func (c *conn) joinEphemeral(topic, group string) {
	c.mu.Lock()
	c.ephemeral[topic+"\x00"+group]++
	c.mu.Unlock()
}

// leaveEphemeral reports whether the member leaving was the group's last.
func (c *conn) leaveEphemeral(topic, group string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := topic + "\x00" + group
	c.ephemeral[k]--
	if c.ephemeral[k] > 0 {
		return false
	}
	delete(c.ephemeral, k)
	return true
}

func (c *conn) addSub(s *sub) error {
	if !c.subs.Add(s) {
		return driver.ErrClosed
	}
	return nil
}

// errClosed is Receive's error after Close.
var errClosed = fmt.Errorf("redisbus: subscriber closed: %w", driver.ErrClosed)

// isNil reports whether err is go-redis's nil reply.
func isNil(err error) bool { return errors.Is(err, redis.Nil) }

// isNoGroup reports whether err says the group does not exist.
func isNoGroup(err error) bool { return redis.HasErrorPrefix(err, "NOGROUP") }

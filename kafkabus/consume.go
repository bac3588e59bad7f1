package kafkabus

// Consuming: a group member is a kgo client in the group; Receive polls
// it (the engine's fetch goroutine), keeping what does not fit the
// engine's room, and Commit stores the engine's watermark (the settle
// goroutine, or a revocation). sub.mu guards the member's state; sub.gate
// is held shared by a commit and exclusively while a partition leaves.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus/driver"
)

// ErrNotOwner is wrapped by a commit for a partition the member does not
// hold (any more): such a commit is never sent.
var ErrNotOwner = errors.New("partition not assigned to this member")

// Subscribe implements driver.Conn: it joins the consumer group
// opts.Group on topic with the cooperative-sticky balancer and returns
// once the member has its first assignment (possibly empty), bounded by
// ctx.
func (c *conn) Subscribe(ctx context.Context, topic string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", topic); err != nil {
		return nil, err
	}
	if opts.Group == "" || opts.Lanes == nil {
		return nil, fmt.Errorf("kafkabus: subscribe %q: group and lanes are required: %w", topic, driver.ErrInvalid)
	}
	if err := c.ensureTopic(ctx, "subscribe", topic); err != nil {
		return nil, err
	}
	s := &sub{
		conn:      c,
		topic:     topic,
		group:     opts.Group,
		ephemeral: opts.Ephemeral,
		start:     opts.StartAt,
		lanes:     opts.Lanes,
		joined:    make(chan struct{}),
		owned:     map[int32]bool{},
		revokedAt: map[int32]uint64{},
		heads:     map[int32]head{},
		member:    newMemberID(),
	}
	kopts := slices.Concat(c.common, c.cfg.consumerOpts(topic, opts), []kgo.Opt{
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
	})
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: subscribe %q group %q: %w: %w", topic, opts.Group, err, driver.ErrInvalid)
	}
	s.cl = cl
	if !c.subs.Add(s) {
		cl.Close()
		return nil, fmt.Errorf("kafkabus: subscribe %q: %w", topic, driver.ErrClosed)
	}

	// The topic's ID, which recording a claim needs (attempts.go), is
	// read while kgo joins the group; a failure is retried there.
	_, _ = s.topicID(ctx)
	wait := time.NewTimer(c.cfg.rebalanceTimeout + c.cfg.sessionTimeout)
	defer wait.Stop()
	var werr error
	select {
	case <-s.joined:
	case <-ctx.Done():
		werr = ctx.Err()
	case <-wait.C:
		werr = errors.New("timed out")
	}
	if werr != nil {
		_ = s.Close()
		return nil, fmt.Errorf("kafkabus: subscribe %q: joining group %q: %w", topic, opts.Group, werr)
	}
	return s, nil
}

// sub is one member of a consumer group: one kgo.Client.
//
// Goroutines: kgo's group management goroutine runs the onAssigned,
// onRevoked and onLost callbacks one at a time; the engine's fetch
// goroutine calls Receive; its settle goroutine (and onRevoked, through
// the engine) calls Commit.
//
// Lock order: gate before mu. mu guards the fields below it; gate is held
// shared by Commit for the whole commit and exclusively while a partition
// leaves owned, so a commit for a partition never runs after it is gone.
type sub struct {
	conn  *conn
	topic string
	group string
	// ephemeral groups (named by omnibus, never resumed) are deleted
	// when their last member leaves.
	ephemeral bool
	start     driver.StartAt
	lanes     driver.Lanes
	cl        *kgo.Client
	member    string // names this sub in the commit metadata it writes (attempts.go)

	joined   chan struct{}
	joinOnce sync.Once

	gate sync.RWMutex

	mu         sync.Mutex
	owned      map[int32]bool   // partitions the member may commit
	revokedAt  map[int32]uint64 // partition -> epoch of its last revocation
	heads      map[int32]head   // the committed offsets of owned partitions (attempts.go)
	id         [16]byte         // the topic's ID, once read (attempts.go)
	epoch      uint64
	interrupt  context.CancelFunc // ends the PollRecords of a Receive in progress
	woken      bool               // Wake came: Receive returns at once
	partitions int                // partition count at the last Lag read
	closed     bool

	carry carry // polled records not returned yet; Receive's own

	closeOnce sync.Once
}

// Receive implements driver.Subscriber. It returns what fits in room of
// the records of partitions the member holds, the partitions taking
// turns (carry.go); records polled that did not fit wait in carry.
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	if s.carry.len() > 0 {
		return s.fit(ctx, room), nil
	}
	for {
		pctx, cancel := context.WithCancel(ctx)
		s.mu.Lock()
		closed, revoked := s.closed, s.epoch != epoch || s.woken
		s.woken = false
		if !closed && !revoked {
			s.interrupt = cancel
		}
		s.mu.Unlock()
		if closed {
			cancel()
			return nil, fmt.Errorf("kafkabus: receive %q: %w", s.topic, driver.ErrClosed)
		}
		if revoked {
			cancel()
			return nil, nil // a revocation waits for this Receive
		}
		fs := s.cl.PollFetches(pctx)
		s.mu.Lock()
		s.interrupt = nil
		interrupted := pctx.Err() != nil
		if interrupted {
			s.woken = false // this Receive returns
		}
		s.mu.Unlock()
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if ferr == nil || errors.Is(err, kgo.ErrClientClosed) {
				ferr = err
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic == s.topic {
				s.carry.add(carried{r, epoch})
			}
		})
		if ds := s.fit(ctx, room); len(ds) > 0 || s.carry.len() > 0 || interrupted {
			// After a revocation the engine wants the Receive back at
			// once, even empty.
			return ds, nil
		}
		if ferr != nil {
			if errors.Is(ferr, kgo.ErrClientClosed) {
				return nil, fmt.Errorf("kafkabus: receive %q: %w", s.topic, driver.ErrClosed)
			}
			return nil, fmt.Errorf("kafkabus: receive %q group %q: %w", s.topic, s.group, classify(ferr))
		}
	}
}

// Wake implements driver.Waker: the PollFetches of a Receive in progress
// ends, and the Receive returns what it polled, possibly nothing; when
// none polls, the Receive in progress (or the next) returns at once.
func (s *sub) Wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.woken = true
	if s.interrupt != nil {
		s.interrupt()
	}
}

// Commit implements driver.Committer: it commits, synchronously, the
// offset after each delivery (each is its lane's settled watermark).
// Partitions the member no longer holds are skipped with an error
// wrapping ErrNotOwner.
func (s *sub) Commit(ctx context.Context, ds []*driver.Delivery) error {
	s.gate.RLock()
	defer s.gate.RUnlock()
	var errs []error
	offs := make(map[int32]kgo.EpochOffset, len(ds))
	s.mu.Lock()
	for _, d := range ds {
		pos, ok := d.Token.(*position)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("kafkabus: commit %q: delivery of lane %q is not from kafkabus: %w", s.topic, d.Lane, driver.ErrInvalid))
		case !s.owned[pos.partition]:
			errs = append(errs, fmt.Errorf("kafkabus: commit %q partition %d: %w", s.topic, pos.partition, ErrNotOwner))
		default:
			if cur, dup := offs[pos.partition]; !dup || cur.Offset < pos.offset+1 {
				offs[pos.partition] = kgo.EpochOffset{Epoch: pos.epoch, Offset: pos.offset + 1}
			}
		}
	}
	s.mu.Unlock()
	if len(offs) == 0 {
		return errors.Join(errs...)
	}
	s.cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{s.topic: offs},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				errs = append(errs, fmt.Errorf("kafkabus: commit %q group %q: %w", s.topic, s.group, classify(err)))
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
						errs = append(errs, fmt.Errorf("kafkabus: commit %q partition %d group %q: %w", s.topic, p.Partition, s.group, classify(err)))
					}
				}
			}
		})
	return errors.Join(errs...)
}

// Close implements driver.Subscriber: the member leaves the group. kgo
// revokes its partitions first, so the engine commits what is settled.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		s.cl.Close()
		if s.ephemeral {
			// Fails while other members remain; the last one succeeds.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = s.conn.adm.DeleteGroup(ctx, s.group)
			cancel()
		}
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.conn.subs.Remove(s)
	})
	return nil
}

package kinesisbus

// Members: Subscribe, the member's state, Receive (the engine's fetch
// goroutine), Commit (its settle goroutine, or a revocation) and Close.
//
// Goroutines of a member, all ended by Close: the taker (balance.go:
// lists shards, scans the lease table, takes and hands over leases; it
// alone calls Lanes.Claimed and Lanes.Revoked; it creates the table again
// when it was deleted, calling Lanes.Lost for every lease held), the
// renewer (renew.go: renews the leases held, each in a goroutine of its
// own that it waits for; calls Lanes.Lost for leases another member
// took), the watchdog (renew.go: gives a lease up at its deadline and
// calls Lanes.Lost at once) and one reader per shard held (reader.go:
// GetRecords into the shard's buffer).
//
// Locks: sub.mu guards the member's maps and every shard's buffer,
// positions and deadline; shard.lmu serializes the conditional writes of
// one lease (renewal, checkpoint, release), which all move its counter.
// Lock order: shard.lmu before sub.mu; no Lanes callback runs under
// either, and no DynamoDB call runs under sub.mu.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Subscribe implements driver.Conn: the member makes sure the group's
// lease table exists, creates the leases of shards that have none, takes
// its first leases and returns.
func (c *conn) Subscribe(ctx context.Context, stream string, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	if err := c.checkOpen("subscribe", stream); err != nil {
		return nil, err
	}
	if opts.Group == "" || opts.Lanes == nil {
		return nil, fmt.Errorf("kinesisbus: subscribe %q: group and lanes are required: %w", stream, driver.ErrInvalid)
	}
	if err := c.ensureStream(ctx, "subscribe", stream, false); err != nil {
		return nil, err
	}
	bctx, cancel := context.WithCancel(context.Background())
	s := &sub{
		conn:      c,
		stream:    stream,
		group:     opts.Group,
		table:     &table{c: c, name: c.cfg.tableName(stream, opts.Group)},
		me:        workerID(),
		start:     opts.StartAt,
		ephemeral: opts.Ephemeral,
		lanes:     opts.Lanes,
		bufBytes:  min(max(opts.MaxInFlightBytes, minBufferedBytes), maxBufferedBytes),
		ctx:       bctx,
		cancel:    cancel,
		wake:      make(chan struct{}, 1),
		kick:      make(chan struct{}, 1),
		check:     make(chan struct{}, 1),
		held:      map[string]*shard{},
		revoke:    map[string]*shard{},
		seen:      map[string]seenLease{},
	}
	s.logger = c.logger.With("stream", stream, "group", opts.Group, "worker", s.me)
	if err := s.table.ensure(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("kinesisbus: subscribe %q group %q: %w", stream, opts.Group, err)
	}
	if !c.subs.Add(s) {
		cancel()
		return nil, fmt.Errorf("kinesisbus: subscribe %q: %w", stream, driver.ErrClosed)
	}
	if err := s.round(ctx, true); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("kinesisbus: subscribe %q group %q: %w", stream, opts.Group, err)
	}
	s.takerCtx, s.takerStop = context.WithCancel(bctx)
	s.takerDone = make(chan struct{})
	s.renewerDone = make(chan struct{})
	s.watchdogDone = make(chan struct{})
	go s.takeLoop()
	go s.renewLoop()
	go s.watchLoop()
	return s, nil
}

// workerID names a member in the lease table (the KCL's worker
// identifier): the host's name and a random suffix, unique per member.
func workerID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "omnibus"
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}

// sub is one member of a group: a worker in the lease table.
type sub struct {
	conn      *conn
	stream    string
	group     string
	table     *table
	me        string
	start     driver.StartAt
	ephemeral bool
	lanes     driver.Lanes
	bufBytes  int // the most bytes a reader holds
	logger    *slog.Logger

	ctx    context.Context // ends at Close: the readers', the renewer's and the watchdog's lifetime
	cancel context.CancelFunc

	takerCtx     context.Context
	takerStop    context.CancelFunc
	takerDone    chan struct{}
	renewerDone  chan struct{}
	watchdogDone chan struct{}
	readers      sync.WaitGroup

	wake  chan struct{} // Receive: records arrived, lanes changed, closed
	kick  chan struct{} // the taker: look again now
	check chan struct{} // the watchdog: a lane was claimed, look again now

	// The taker's own (balance.go).
	seen      map[string]seenLease
	lastSync  time.Time
	restoring bool // the lease table was deleted: leases created are restoredOwner's
	// listed is the stream's shards at the last shard sync (cleanup.go).
	listed []shardInfo

	mu      sync.Mutex
	held    map[string]*shard // leases the member holds, claimed or being claimed
	epoch   uint64            // moves when lanes leave: a Receive in progress returns
	rr      int               // where Receive starts, for fairness between shards
	closed  bool
	leaving int               // Lanes.Revoked or Lost calls in progress
	revoke  map[string]*shard // to revoke at the taker's next round: hand-overs asked for, shards ended
	syncNow bool              // the taker lists the shards at its next round

	closeOnce sync.Once
}

// shard is a lease the member holds and the shard's reading state.
type shard struct {
	id   string
	from *lease // the lease as taken: where the reader starts

	// lmu serializes the lease's conditional writes; it guards counter
	// and handOver.
	lmu      sync.Mutex
	counter  int64
	handOver bool // another member asked for it: leaseOwner is theirs, checkpointOwner ours

	// Guarded by sub.mu.
	// deadline is when the member stops using the lease unless it
	// writes it again first (extend); expired is set once it passed, for
	// good: nothing of the shard is delivered or checkpointed any more.
	deadline  time.Time
	expired   bool
	cutDrain  context.CancelFunc // ends the Revoked call draining it, if one does
	claimed   bool               // Lanes.Claimed was called: Receive may return its records
	revoking  bool               // on its way out: Receive returns none of it
	gone      bool               // revoked or lost: nothing is committed any more
	buf       []*driver.Delivery
	bufBytes  int
	ended     bool   // the reader reached the end of the closed shard
	finished  bool   // SHARD_END is checkpointed
	lastOut   string // position of the last delivery Receive returned
	committed string // position last checkpointed
	space     chan struct{}
	stop      context.CancelFunc // the reader's
	done      chan struct{}      // closed when the reader returns
}

// token is a delivery's handle: its shard (this claim of it) and
// position.
type token struct {
	shard *shard
	seq   string
}

// Bounds of what a reader holds beyond what Receive returned: the
// records, and the bytes (the subscription's MaxInFlightBytes, within
// these).
const (
	maxBuffered      = 10000
	minBufferedBytes = 1 << 20
	maxBufferedBytes = 16 << 20
)

// leavingPoll is how long Receive waits while lanes leave.
const leavingPoll = 20 * time.Millisecond

// Receive implements driver.Subscriber: it returns, in each shard's order,
// what fits in room of the records the readers fetched, taking from the
// shards in turn.
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("kinesisbus: receive %q: %w", s.stream, driver.ErrClosed)
		}
		if s.epoch != epoch {
			s.mu.Unlock()
			return nil, nil // a revocation waits for this Receive
		}
		ds := s.takeLocked(room)
		leaving := s.leaving > 0
		s.mu.Unlock()
		if len(ds) > 0 {
			return ds, nil
		}
		if leaving {
			// Lanes.Revoked or Lost waits for a Receive in progress,
			// maybe this one, which started after the lanes changed:
			// return soon, even empty.
			if !sleep(ctx, leavingPoll) {
				return nil, ctx.Err()
			}
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.wake:
		}
	}
}

// takeLocked takes from the shards' buffers what fits in room; nothing
// of a shard whose lease is past its deadline.
func (s *sub) takeLocked(room driver.Room) []*driver.Delivery {
	ids := make([]string, 0, len(s.held))
	for id := range s.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var ds []*driver.Delivery
	bytes := 0
	s.rr++
	now := time.Now()
	for i := range ids {
		sh := s.held[ids[(s.rr+i)%len(ids)]]
		if !sh.claimed || sh.revoking || sh.gone || !s.validLocked(sh, now) {
			continue
		}
		n := 0
		for ; n < len(sh.buf); n++ {
			d := sh.buf[n]
			size := d.Size()
			if !room.Fits(len(ds), bytes, size) {
				break
			}
			bytes += size
			sh.bufBytes -= size
			ds = append(ds, d)
			sh.lastOut = d.Position
		}
		if n > 0 {
			rest := copy(sh.buf, sh.buf[n:])
			clear(sh.buf[rest:])
			sh.buf = sh.buf[:rest]
			driver.Notify(sh.space)
		}
		if n < len(sh.buf) {
			break // the first waiting did not fit
		}
	}
	return ds
}

// Commit implements driver.Committer: it checkpoints each delivery's
// sequence number in its lease, conditional on the member still owning
// the lease with the counter it last wrote. The last record of a shard
// that ended is checkpointed as SHARD_END. Leases the member no longer
// holds are refused with an error wrapping ErrNotOwner. The shards'
// leases are written in parallel (one shard's in order), so a Commit
// takes one write's time (at most leaseTimeout), however many shards it
// covers.
func (s *sub) Commit(ctx context.Context, ds []*driver.Delivery) error {
	var errs []error
	var order []*shard
	seqs := map[*shard][]string{}
	for _, d := range ds {
		tok, ok := d.Token.(*token)
		if !ok {
			errs = append(errs, fmt.Errorf("kinesisbus: commit %q: delivery of lane %q is not from kinesisbus: %w", s.stream, d.Lane, driver.ErrInvalid))
			continue
		}
		if seqs[tok.shard] == nil {
			order = append(order, tok.shard)
		}
		seqs[tok.shard] = append(seqs[tok.shard], tok.seq)
	}
	failed := make([]error, len(order))
	var wg sync.WaitGroup
	for i, sh := range order {
		wg.Go(func() {
			for _, seq := range seqs[sh] {
				if err := s.checkpoint(ctx, sh, seq); err != nil {
					failed[i] = errors.Join(failed[i], err)
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, failed...)...)
}

// checkpoint stores seq as sh's checkpoint (SHARD_END when it is the last
// record of the ended shard), then finishes the shard if it ended.
func (s *sub) checkpoint(ctx context.Context, sh *shard, seq string) error {
	s.mu.Lock()
	gone := sh.gone
	last := sh.ended && len(sh.buf) == 0 && sh.lastOut == seq
	s.mu.Unlock()
	if gone {
		return fmt.Errorf("kinesisbus: commit %q shard %s: %w", s.stream, sh.id, ErrNotOwner)
	}
	if last {
		return s.finish(ctx, sh)
	}
	if err := s.write(ctx, sh, seq); err != nil {
		return err
	}
	s.mu.Lock()
	sh.committed = seq
	s.mu.Unlock()
	return s.maybeFinish(ctx, sh)
}

// write checkpoints position in sh's lease, unless the lease is past its
// deadline. A write begun before the deadline may land after it: it is
// conditional on the counter, which only this member's writes moved
// since, so no other member has read the shard under a lease of its own
// yet, and what it records was handled (handed out before the
// deadline); landing, it moves the counter, so no member takes the lease
// for failover_time after that.
func (s *sub) write(ctx context.Context, sh *shard, position string) error {
	sh.lmu.Lock()
	defer sh.lmu.Unlock()
	begin := time.Now()
	if !s.valid(sh, begin) {
		return fmt.Errorf("kinesisbus: commit %q shard %s: the lease is past its deadline: %w", s.stream, sh.id, ErrNotOwner)
	}
	ctx, cancel := context.WithTimeout(ctx, s.conn.leaseTimeout())
	defer cancel()
	err := s.table.checkpoint(ctx, sh.id, sh.counter, s.me, sh.handOver, position, 0)
	s.nudge(err)
	if errors.Is(err, ErrNotOwner) {
		l, gerr := s.table.get(ctx, sh.id)
		switch {
		case gerr != nil || l == nil:
		case l.counter == sh.counter+1 && l.checkpoint == position && s.ours(l, sh.handOver):
			// A write of ours whose answer was lost and that the SDK
			// sent again fails its condition: it landed.
			err = nil
		case s.handOverAsked(sh, l):
			err = s.table.checkpoint(ctx, sh.id, sh.counter, s.me, sh.handOver, position, 0)
		}
	}
	if err != nil {
		if errors.Is(err, ErrNotOwner) {
			s.kickTaker(false)
		}
		return fmt.Errorf("kinesisbus: commit %q: %w", s.stream, err)
	}
	sh.counter++
	s.extend(sh, begin)
	return nil
}

// handOverAsked checks whether another member asked for sh (l is its
// lease as read); if so sh goes into hand-over mode, its lane is revoked
// at the taker's next round, and it reports true. The caller holds
// sh.lmu.
func (s *sub) handOverAsked(sh *shard, l *lease) bool {
	if sh.handOver || l.checkpointOwner != s.me || l.owner == s.me {
		return false
	}
	// The counter is the one this member wrote last (a hand-over
	// leaves it alone): the deadline stays.
	sh.handOver, sh.counter = true, l.counter
	s.mu.Lock()
	s.revoke[sh.id] = sh
	s.mu.Unlock()
	driver.Notify(s.kick)
	s.logger.Info("handing a lease over", "shard", sh.id, "to", l.owner)
	return true
}

// ours reports whether l is held by the member, as its owner or, in a
// hand-over, as its checkpoint owner.
func (s *sub) ours(l *lease, handOver bool) bool {
	if handOver {
		return l.checkpointOwner == s.me
	}
	return l.owner == s.me && l.checkpointOwner == ""
}

// maybeFinish finishes sh when it ended and everything read of it is
// checkpointed.
func (s *sub) maybeFinish(ctx context.Context, sh *shard) error {
	s.mu.Lock()
	done := sh.ended && !sh.finished && !sh.gone && len(sh.buf) == 0 && sh.lastOut == sh.committed
	s.mu.Unlock()
	if !done {
		return nil
	}
	return s.finish(ctx, sh)
}

// finish checkpoints SHARD_END in sh's lease: its children may now be
// leased. The taker then revokes the lane and releases the lease.
func (s *sub) finish(ctx context.Context, sh *shard) error {
	if err := s.write(ctx, sh, ShardEnd); err != nil {
		return err
	}
	s.mu.Lock()
	sh.finished = true
	sh.committed = sh.lastOut
	s.revoke[sh.id] = sh
	s.syncNow = true
	s.mu.Unlock()
	s.logger.Info("shard read to its end", "shard", sh.id)
	s.kickTaker(true)
	return nil
}

// kickTaker makes the taker run a round now (listing the shards first
// when sync is set).
func (s *sub) kickTaker(sync bool) {
	if sync {
		s.mu.Lock()
		s.syncNow = true
		s.mu.Unlock()
	}
	driver.Notify(s.kick)
}

// Close implements driver.Subscriber: the member stops taking leases,
// stops reading and releases every lease it holds (the engine committed
// what was settled before), so the other members take them at once. An
// ephemeral group's lease table is deleted with its last member. Close
// returns within leaseTimeout once the taker and a Revoked in progress
// are done (failover_time more for an ephemeral group's table), even
// when DynamoDB does not answer: a lease not released expires.
func (s *sub) Close() error {
	s.closeOnce.Do(func() {
		if s.takerStop != nil {
			s.takerStop()
			<-s.takerDone
		}
		s.mu.Lock()
		s.closed = true
		held := make([]*shard, 0, len(s.held))
		for _, sh := range s.held {
			sh.gone = true
			sh.buf = nil
			held = append(held, sh)
		}
		s.held = map[string]*shard{}
		s.mu.Unlock()
		driver.Notify(s.wake)
		s.cancel()
		if s.renewerDone != nil {
			<-s.renewerDone
			<-s.watchdogDone
		}
		s.readers.Wait()
		// In parallel, each bounded by leaseTimeout: Close takes one
		// release's time even when DynamoDB does not answer.
		var wg sync.WaitGroup
		for _, sh := range held {
			wg.Go(func() { s.release(context.Background(), sh) })
		}
		wg.Wait()
		if s.ephemeral {
			ctx, cancel := context.WithTimeout(context.Background(), s.conn.cfg.failover)
			defer cancel()
			s.dropIfUnused(ctx)
		}
		s.conn.subs.Remove(s)
	})
	return nil
}

// release gives up sh's lease; failures are logged (the lease then
// expires after failover_time).
func (s *sub) release(ctx context.Context, sh *shard) {
	sh.lmu.Lock()
	defer sh.lmu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.conn.leaseTimeout())
	defer cancel()
	if err := s.table.release(ctx, sh.id, sh.counter, s.me, sh.handOver); err != nil {
		if !errors.Is(err, ErrNotOwner) {
			s.logger.Warn("releasing a lease failed; it expires after failover_time", "shard", sh.id, "err", err)
		}
		return
	}
	sh.counter++
}

// dropIfUnused deletes the lease table when no member holds a lease.
func (s *sub) dropIfUnused(ctx context.Context) {
	leases, err := s.table.scan(ctx)
	if err != nil {
		return
	}
	for _, l := range leases {
		if l.owner != "" && l.owner != restoredOwner || l.checkpointOwner != "" {
			return
		}
	}
	if err := s.table.drop(ctx); err != nil {
		s.logger.Debug("deleting the lease table of an ephemeral group failed", "err", err)
	}
}

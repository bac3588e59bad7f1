package kafkabus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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

	joined   chan struct{}
	joinOnce sync.Once

	gate sync.RWMutex

	mu         sync.Mutex
	owned      map[int32]bool   // partitions the member may commit
	revokedAt  map[int32]uint64 // partition -> epoch of its last revocation
	epoch      uint64
	interrupt  context.CancelFunc // ends the PollRecords of a Receive in progress
	partitions int                // partition count at the last Lag read
	closed     bool

	carry []carried // polled records that did not fit; Receive's own

	closeOnce sync.Once
}

func lanesOf(ps []int32) []string {
	ls := make([]string, len(ps))
	for i, p := range ps {
		ls[i] = laneName(p)
	}
	return ls
}

// onAssigned is kgo's OnPartitionsAssigned: it runs before fetching of
// the added partitions starts.
func (s *sub) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	defer s.joinOnce.Do(func() { close(s.joined) })
	ps := assigned[s.topic]
	if len(ps) == 0 {
		return
	}
	slices.Sort(ps)
	if s.start == driver.StartLatest {
		s.pinStart(ctx, cl, ps)
	}
	s.mu.Lock()
	for _, p := range ps {
		s.owned[p] = true
	}
	s.mu.Unlock()
	s.lanes.Claimed(lanesOf(ps))
}

// pinStart commits a starting offset for the partitions of ps the group
// has never committed, before kgo reads the group's offsets: the end of
// the partition when the group has no commit on the topic at all (a new
// group starts at the latest message), the start of the partition when it
// has commits on other partitions (a partition added after the group
// started is read from its beginning). Committing the start makes "latest"
// stable: a member that fails before its first commit does not make the
// next owner skip what arrived in between. Failures leave kgo's reset
// offset (the end) in charge.
func (s *sub) pinStart(ctx context.Context, cl *kgo.Client, ps []int32) {
	ctx, cancel := context.WithTimeout(ctx, s.conn.cfg.requestTimeout)
	defer cancel()
	adm := s.conn.adm
	committed, err := adm.FetchOffsets(ctx, s.group)
	if err != nil {
		return
	}
	any := false
	var missing []int32
	for _, p := range ps {
		if o, ok := committed.Lookup(s.topic, p); ok && o.Err == nil && o.At >= 0 {
			continue
		}
		missing = append(missing, p)
	}
	if len(missing) == 0 {
		return
	}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.Topic == s.topic && o.Err == nil && o.At >= 0 {
			any = true
		}
	})
	list := adm.ListEndOffsets
	if any {
		list = adm.ListStartOffsets
	}
	listed, err := list(ctx, s.topic)
	if err != nil {
		return
	}
	offs := map[int32]kgo.EpochOffset{}
	for _, p := range missing {
		if o, ok := listed.Lookup(s.topic, p); ok && o.Err == nil && o.Offset >= 0 {
			offs[p] = kgo.EpochOffset{Epoch: -1, Offset: o.Offset}
		}
	}
	if len(offs) > 0 {
		cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{s.topic: offs}, nil)
	}
}

// onRevoked is kgo's OnPartitionsRevoked. kgo has stopped fetching the
// partitions and dropped what it buffered of them; the engine drains the
// lanes and commits through Commit before this returns, and only then
// can the group hand the partitions to another member.
func (s *sub) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	ps := s.drop(revoked[s.topic])
	if len(ps) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.conn.cfg.rebalanceTimeout)
	defer cancel()
	s.lanes.Revoked(rctx, lanesOf(ps))
	s.disown(ps)
}

// onLost is kgo's OnPartitionsLost: the session is gone, nothing can be
// committed.
func (s *sub) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	ps := s.drop(lost[s.topic])
	if len(ps) == 0 {
		return
	}
	s.disown(ps)
	s.lanes.Lost(lanesOf(ps))
}

// drop marks the owned partitions of ps revoked, so Receive returns none
// of their records from now on, and returns them.
func (s *sub) drop(ps []int32) []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int32
	for _, p := range ps {
		if s.owned[p] {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	s.epoch++
	for _, p := range out {
		s.revokedAt[p] = s.epoch
	}
	if s.interrupt != nil {
		s.interrupt() // the engine waits for a Receive in progress
	}
	slices.Sort(out)
	return out
}

// disown forgets ps once no commit for them is running.
func (s *sub) disown(ps []int32) {
	s.gate.Lock()
	s.mu.Lock()
	for _, p := range ps {
		delete(s.owned, p)
	}
	s.mu.Unlock()
	s.gate.Unlock()
}

// Receive implements driver.Subscriber. It returns what fits in room of
// the records of partitions the member holds; kgo keeps the rest of a
// fetch buffered, and records polled that did not fit wait in carry.
func (s *sub) Receive(ctx context.Context, room driver.Room) ([]*driver.Delivery, error) {
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	if len(s.carry) > 0 {
		return s.fit(room), nil
	}
	for {
		pctx, cancel := context.WithCancel(ctx)
		s.mu.Lock()
		closed, revoked := s.closed, s.epoch != epoch
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
		fs := s.cl.PollRecords(pctx, max(1, room.Count))
		s.mu.Lock()
		s.interrupt = nil
		s.mu.Unlock()
		interrupted := pctx.Err() != nil
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
				s.carry = append(s.carry, carried{r, epoch})
			}
		})
		if ds := s.fit(room); len(ds) > 0 || len(s.carry) > 0 || interrupted {
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

// carried is a polled record waiting in carry, with the epoch it was
// polled in.
type carried struct {
	r     *kgo.Record
	epoch uint64
}

// fit takes from carry the deliveries that fit in room, in order. A
// record polled while its partition was revoked belongs to the old claim
// and is dropped: the next owner reads it again.
func (s *sub) fit(room driver.Room) []*driver.Delivery {
	var ds []*driver.Delivery
	bytes, i := 0, 0
	s.mu.Lock()
	for ; i < len(s.carry); i++ {
		c := s.carry[i]
		if !s.owned[c.r.Partition] || s.revokedAt[c.r.Partition] > c.epoch {
			continue
		}
		d := delivery(c.r)
		size := d.Size()
		if !room.Fits(len(ds), bytes, size) {
			break
		}
		bytes += size
		ds = append(ds, d)
	}
	s.mu.Unlock()
	rest := copy(s.carry, s.carry[i:])
	clear(s.carry[rest:])
	s.carry = s.carry[:rest]
	return ds
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
		pos, ok := d.Token.(position)
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

// Lag implements driver.LagReader: for every partition of the topic, the
// high watermark minus the group's committed offset, or minus the log
// start offset when the group has committed nothing there. A partition
// whose offsets cannot be read has Known false.
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	s.mu.Lock()
	n := s.partitions
	s.mu.Unlock()
	lags, err := s.conn.lag(ctx, s.topic, s.group, n)
	if err == nil {
		s.mu.Lock()
		s.partitions = len(lags)
		s.mu.Unlock()
	}
	return lags, err
}

// GroupLag implements driver.GroupLagReader: the lag of group on every
// partition of topic, read with the admin client, without joining. A
// group the cluster does not know is ErrNotFound.
func (c *conn) GroupLag(ctx context.Context, topic, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", topic); err != nil {
		return nil, err
	}
	groups, err := c.adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("kafkabus: lag %q group %q: %w", topic, group, classify(err))
	}
	if g, ok := groups[group]; !ok || g.State == "Dead" {
		return nil, fmt.Errorf("kafkabus: lag %q: group %q: %w", topic, group, driver.ErrNotFound)
	}
	return c.lag(ctx, topic, group, 0)
}

// lag reads the group's lag on every partition of topic: the end offset
// minus the committed offset, or minus the log start where the group has
// committed nothing. known is the partition count from an earlier read,
// so that a failed read still lists every partition, as unknown.
func (c *conn) lag(ctx context.Context, topic, group string, known int) ([]driver.LaneLag, error) {
	adm := c.adm
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil && len(ends) == 0 {
		if known == 0 {
			return nil, fmt.Errorf("kafkabus: lag %q: end offsets: %w", topic, classify(err))
		}
		lags := make([]driver.LaneLag, known)
		for p := range lags {
			lags[p] = driver.LaneLag{Lane: laneName(int32(p))}
		}
		return lags, nil
	}
	topicEnds := ends[topic]
	if bad, ok := topicEnds[-1]; ok && bad.Err != nil {
		return nil, fmt.Errorf("kafkabus: lag %q: %w", topic, classify(bad.Err))
	}
	starts, serr := adm.ListStartOffsets(ctx, topic)
	committed, cerr := adm.FetchOffsets(ctx, group)
	parts := make([]int32, 0, len(topicEnds))
	for p := range topicEnds {
		if p >= 0 {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	lags := make([]driver.LaneLag, 0, len(parts))
	for _, p := range parts {
		end := topicEnds[p]
		l := driver.LaneLag{Lane: laneName(p)}
		from := int64(-1)
		if cerr == nil {
			if o, ok := committed.Lookup(topic, p); ok && o.Err == nil && o.At >= 0 {
				from = o.At
			} else if !ok || o.Err == nil {
				if st, ok := starts.Lookup(topic, p); ok && serr == nil && st.Err == nil && st.Offset >= 0 {
					from = st.Offset
				}
			}
		}
		if end.Err == nil && end.Offset >= 0 && from >= 0 {
			l.Lag, l.Known = max(end.Offset-from, 0), true
		}
		lags = append(lags, l)
	}
	return lags, nil
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

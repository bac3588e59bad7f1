package natsbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

// Defaults of the partitioned mode's URL parameters.
const (
	// DefaultLeaseTTL is how long a partition lease lives without being
	// refreshed (URL lease_ttl): how soon a crashed member's partitions
	// move to the others.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultRebalanceInterval is how often a member compares its share
	// of the partitions with the other members' (URL rebalance_interval).
	DefaultRebalanceInterval = time.Second
	// minLeaseTTL is the shortest lease_ttl accepted.
	minLeaseTTL = 500 * time.Millisecond
)

// Names of the partitioned mode's server-side objects.
//
//   - partitionConsumer: the durable consumer of one partition for a group;
//   - leaseBucket: the KV bucket of a group's leases, one per stream and
//     group, holding "p.<partition>" = owner's member ID and
//     "m.<member ID>" = a member's heartbeat;
//   - positionBucket: the KV bucket of a group's positions (see
//     positions), partitioned or not.
func partitionConsumer(group string, p int) string { return safeName(group) + "_p" + strconv.Itoa(p) }
func leaseBucket(stream, group string) string      { return safeName(stream + ".leases." + group) }
func positionBucket(stream, group string) string   { return safeName(stream + ".positions." + group) }
func leaseKey(p int) string                        { return "p." + strconv.Itoa(p) }
func memberKey(id string) string                   { return "m." + id }

// pinGroup is the priority group of a pinned partition consumer.
const pinGroup = "omnibus"

// canPin reports whether the connected server has pinned-client priority
// groups (nats-server 2.11 and later).
func (c *conn) canPin() bool {
	v := strings.SplitN(strings.TrimPrefix(c.nc.ConnectedServerVersion(), "v"), ".", 3)
	if len(v) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(v[0])
	minor, err2 := strconv.Atoi(v[1])
	return err1 == nil && err2 == nil && (major > 2 || major == 2 && minor >= 11)
}

// pin makes cc a pinned-client consumer when the server has them: the
// server then serves the pulls of one client only, until it is unpinned
// or has pulled nothing for lease_ttl.
func (c *conn) pin(cc *jetstream.ConsumerConfig) {
	if c.canPin() {
		cc.PriorityPolicy, cc.PriorityGroups, cc.PinnedTTL = jetstream.PriorityPolicyPinned, []string{pinGroup}, c.cfg.leaseTTL
	}
}

// pinned reports whether a consumer serves a pinned client of pinGroup.
func pinned(info *jetstream.ConsumerInfo) bool {
	return info.Config.PriorityPolicy == jetstream.PriorityPolicyPinned && slices.Contains(info.Config.PriorityGroups, pinGroup)
}

// subscribePartitioned joins group on a partitioned topic. Each partition
// has a durable consumer of its own (created here, all starting at the
// same point for a new group); the members of the group share the
// partitions through leases in a KV bucket, each partition read by one
// member at a time.
func (c *conn) subscribePartitioned(ctx context.Context, topic string, ref *streamRef, opts driver.SubscribeOptions) (driver.Subscriber, error) {
	fail := func(err error) (driver.Subscriber, error) {
		return nil, fmt.Errorf("natsbus: subscribe %q group %q: %w", topic, opts.Group, err)
	}
	s := newSub(c, topic, ref, opts)
	var err error
	if s.pos, err = c.positions(ctx, ref, opts.Group); err != nil {
		return fail(err)
	}
	if err := s.join(ctx); err != nil {
		return fail(err)
	}
	kv, ttl, err := c.leaseBucket(ctx, ref, opts.Group)
	if err != nil {
		return fail(err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &partitioned{
		s: s, kv: kv, id: omnibus.NewID(), ttl: ttl, every: c.cfg.rebalance, parts: ref.parts,
		ctx: pctx, cancel: cancel,
		ready:  make(chan struct{}),
		wakeup: make(chan struct{}, 1),
		check:  make(chan struct{}, 1),
		leases: map[int]*lease{},
		view:   map[string]viewEntry{},
	}
	s.part = p
	if err := c.addSub(s); err != nil {
		cancel()
		return fail(err)
	}
	if err := p.start(ctx); err != nil {
		cancel()
		c.removeSub(s)
		return fail(classify(err))
	}
	if opts.Ephemeral {
		c.joinEphemeral(ref.name, opts.Group)
		s.cleanup = func(ctx context.Context) {
			if !c.leaveEphemeral(ref.name, opts.Group) {
				return
			}
			for _, lane := range s.lanes() {
				_ = c.js.DeleteConsumer(ctx, ref.name, s.consumerName(lane))
			}
			_ = c.js.DeleteKeyValue(ctx, kv.Bucket())
			_ = c.js.DeleteKeyValue(ctx, s.pos.kv.Bucket())
		}
	}
	s.startKeeper()
	return s, nil
}

// leaseBucket opens, or creates, the KV bucket of group's leases and
// returns it with its TTL. An existing bucket keeps its TTL (the first
// member to create it set it), so every member agrees on it.
func (c *conn) leaseBucket(ctx context.Context, ref *streamRef, group string) (jetstream.KeyValue, time.Duration, error) {
	name := leaseBucket(ref.name, group)
	kv, err := c.bucket(ctx, jetstream.KeyValueConfig{
		Bucket:      name,
		Description: "omnibus partition leases of group " + group + " on stream " + ref.name,
		TTL:         c.cfg.leaseTTL,
	})
	if err != nil {
		return nil, 0, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("lease bucket %q: %w", name, classify(err))
	}
	ttl := st.TTL()
	if ttl < minLeaseTTL {
		return nil, 0, fmt.Errorf("lease bucket %q has TTL %v; leases need one of at least %v (delete the bucket to have it created again): %w",
			name, ttl, minLeaseTTL, driver.ErrInvalid)
	}
	return kv, ttl, nil
}

// partitioned is a member's share of a partitioned topic: the leases it
// holds and the goroutines that keep them.
//
// Goroutines, ended by stop: the watcher (the bucket's keys into view),
// the refresher (heartbeat and leases every ttl/4), the balancer (takes
// and gives up partitions; calls Lanes.Claimed and Lanes.Revoked) and the
// watchdog (gives up a lease at its deadline and calls Lanes.Lost, so
// that a lost lane reaches the engine at once, never behind another
// lane's drain). Lock order: kvMu before sub.mu; viewMu alone. No Lanes
// call is made with a lock held.
type partitioned struct {
	s      *sub
	kv     jetstream.KeyValue
	id     string // member ID
	ttl    time.Duration
	every  time.Duration
	parts  int
	ctx    context.Context // I/O and Revoked; cancelled by stop
	cancel context.CancelFunc
	watch  jetstream.KeyWatcher
	ready  chan struct{} // closed when the watcher delivered the initial keys
	wakeup chan struct{} // a lease was lost: balance now
	check  chan struct{} // a lease was claimed or lost: the watchdog looks again
	wg     sync.WaitGroup

	kvMu   sync.Mutex // serializes lease writes; guards leases and their fields
	leases map[int]*lease

	viewMu sync.Mutex
	view   map[string]viewEntry // the bucket's keys as last seen
}

// lease is a partition this member holds in the bucket.
type lease struct {
	part      int
	lane      string
	rev       uint64    // the key's revision we wrote last
	deadline  time.Time // ours until then, unless refreshed
	reader    *reader   // nil until claimed
	claimed   bool      // Lanes.Claimed returned
	releasing bool      // release owns it from here on
	revoke    func()    // ends release's Revoked early: set while it runs
	lost      bool      // taken away or expired
}

type viewEntry struct {
	value string
	seen  time.Time // local time of the last write seen
}

func (p *partitioned) start(ctx context.Context) error {
	if _, err := p.kv.Put(ctx, memberKey(p.id), []byte(p.s.c.cfg.name)); err != nil {
		return fmt.Errorf("lease bucket %q: heartbeat: %w", p.kv.Bucket(), err)
	}
	w, err := p.kv.WatchAll(p.ctx)
	if err != nil {
		_ = p.kv.Delete(ctx, memberKey(p.id))
		return fmt.Errorf("lease bucket %q: watch: %w", p.kv.Bucket(), err)
	}
	p.watch = w
	p.wg.Add(4)
	go p.watchLoop()
	go p.refreshLoop()
	go p.balanceLoop()
	go p.watchdogLoop()
	return nil
}

// stop ends the lease goroutines; a Revoked in progress returns early.
func (p *partitioned) stop() {
	p.cancel()
	if p.watch != nil {
		_ = p.watch.Stop()
	}
	p.wg.Wait()
}

func (p *partitioned) watchLoop() {
	defer p.wg.Done()
	ready := false
	for e := range p.watch.Updates() {
		if e == nil {
			if !ready {
				ready = true
				close(p.ready)
			}
			continue
		}
		p.viewMu.Lock()
		if e.Operation() == jetstream.KeyValuePut {
			p.view[e.Key()] = viewEntry{value: string(e.Value()), seen: time.Now()}
		} else {
			delete(p.view, e.Key())
		}
		p.viewMu.Unlock()
	}
}

// extendLocked records a successful write of l made at begin. The server
// expires the key ttl after it wrote it, so after begin + ttl; the member
// stops using the lease a quarter of ttl before that.
func (p *partitioned) extendLocked(l *lease, begin time.Time) {
	l.deadline = begin.Add(p.ttl * 3 / 4)
	if l.reader != nil {
		l.reader.deadline.Store(l.deadline.UnixNano())
	}
}

// loseLocked marks l lost: its lane delivers and acknowledges nothing
// more, and the watchdog tells the engine.
func (p *partitioned) loseLocked(l *lease) {
	l.lost = true
	if r := l.reader; r != nil {
		r.lost.Store(true)
		r.halt(false)
	}
	driver.Notify(p.check)
}

func (p *partitioned) refreshLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.ttl / 4)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		p.refresh()
	}
}

// refresh writes the member's heartbeat and every lease it holds, each
// conditional on the revision it wrote last.
func (p *partitioned) refresh() {
	ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
	_, _ = p.kv.Put(ctx, memberKey(p.id), []byte(p.s.c.cfg.name))
	cancel()
	p.kvMu.Lock()
	defer p.kvMu.Unlock()
	lost := false
	for _, l := range p.leases {
		if l.lost {
			continue
		}
		begin := time.Now()
		if begin.After(l.deadline) || (l.reader != nil && !l.reader.valid(begin)) {
			// Unrefreshed too long: the lease may have expired on the
			// server. Give it up, and free it if it is still ours.
			p.loseLocked(l)
			lost = true
			ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
			_ = p.kv.Delete(ctx, leaseKey(l.part), jetstream.LastRevision(l.rev))
			cancel()
			continue
		}
		ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
		rev, err := p.kv.Update(ctx, leaseKey(l.part), []byte(p.id), l.rev)
		cancel()
		switch {
		case err == nil:
			l.rev = rev
			p.extendLocked(l, begin)
		case p.ctx.Err() != nil:
			return
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			// Expired on the server, and maybe taken.
			p.loseLocked(l)
			lost = true
		}
	}
	if lost {
		driver.Notify(p.wakeup)
	}
}

func (p *partitioned) watchdogLoop() {
	defer p.wg.Done()
	t := time.NewTimer(p.ttl)
	defer t.Stop()
	for {
		t.Reset(time.Until(p.expire(time.Now())))
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		case <-p.check:
		}
	}
}

// expire gives up the leases whose deadline passed and tells the engine
// about the lanes lost (a lane being released has its drain cut short
// instead; a lane being claimed is reported by claim). It returns when to
// look again: the earliest deadline.
func (p *partitioned) expire(now time.Time) (next time.Time) {
	next = now.Add(p.ttl / 4)
	var lost []*lease
	p.kvMu.Lock()
	for part, l := range p.leases {
		if !l.lost && !now.Before(l.deadline) {
			p.loseLocked(l)
		}
		switch {
		case !l.lost:
			if l.deadline.Before(next) {
				next = l.deadline
			}
		case l.releasing:
			if l.revoke != nil {
				l.revoke()
			}
		case l.claimed:
			delete(p.leases, part)
			lost = append(lost, l)
		}
	}
	p.kvMu.Unlock()
	p.reportLost(lost)
	return next
}

// reportLost tells the engine that the lanes of leases were lost and
// forgets their readers.
func (p *partitioned) reportLost(leases []*lease) {
	if len(leases) == 0 {
		return
	}
	lanes := make([]string, len(leases))
	for i, l := range leases {
		lanes[i] = l.lane
	}
	driver.Notify(p.s.wake)
	p.s.opts.Lanes.Lost(lanes)
	for _, l := range leases {
		p.detach(l.reader)
	}
	driver.Notify(p.wakeup)
}

func (p *partitioned) balanceLoop() {
	defer p.wg.Done()
	select {
	case <-p.ready:
	case <-time.After(p.ttl):
	case <-p.ctx.Done():
		return
	}
	t := time.NewTicker(p.every)
	defer t.Stop()
	for p.ctx.Err() == nil {
		if p.balance() {
			continue // gave one up above the fair share: the next at once
		}
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		case <-p.wakeup:
		}
	}
}

// balance takes free partitions up to the member's fair share and gives
// up one above it, KCL-style: with n live members and N partitions, a
// member holds at most ceil(N/n); while another member holds fewer than
// floor(N/n), members at floor(N/n) or more take no free partition, and
// when none is free, the most loaded member (the lowest ID among equals)
// gives one up. It reports whether it gave one up above ceil(N/n), so the
// caller goes on at once.
func (p *partitioned) balance() (again bool) {
	now := time.Now()
	p.kvMu.Lock()
	mine := make(map[int]bool, len(p.leases))
	for part, l := range p.leases {
		if !l.lost {
			mine[part] = true
		}
	}
	p.kvMu.Unlock()

	owner := make([]string, p.parts)
	counts := map[string]int{p.id: 0}
	p.viewMu.Lock()
	for k, e := range p.view {
		if now.Sub(e.seen) > p.ttl {
			continue // expired on the server by now
		}
		switch {
		case strings.HasPrefix(k, "m."):
			if _, ok := counts[k[2:]]; !ok {
				counts[k[2:]] = 0
			}
		case strings.HasPrefix(k, "p."):
			if part, err := strconv.Atoi(k[2:]); err == nil && part >= 0 && part < p.parts {
				owner[part] = e.value
			}
		}
	}
	p.viewMu.Unlock()
	var free, held []int
	for part := range p.parts {
		switch {
		case mine[part]:
			held = append(held, part)
			counts[p.id]++
		case owner[part] == p.id:
			// Given up or failed to claim, the deletion not seen yet: not
			// free for this member until it is.
		case owner[part] == "":
			free = append(free, part)
		default:
			counts[owner[part]]++
		}
	}
	n := len(counts)
	floor, ceil := p.parts/n, (p.parts+n-1)/n
	have := len(held)
	needy := false // another member holds fewer than its floor
	for id, c := range counts {
		if id != p.id && c < floor {
			needy = true
		}
	}
	switch {
	case have > ceil:
		p.release(held[len(held)-1])
		return true
	case len(free) > 0:
		limit := ceil
		if needy {
			limit = floor
		}
		rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		for _, part := range free[:max(0, min(len(free), limit-have))] {
			p.claim(part)
		}
	case needy && have > floor:
		giver := p.id
		for id, c := range counts {
			if c > counts[giver] || (c == counts[giver] && id < giver) {
				giver = id
			}
		}
		if giver == p.id {
			p.release(held[len(held)-1])
		}
	}
	return false
}

// claim takes partition part when it is free: it writes the lease, makes
// sure the partition's consumer resumes in order (see prepare), tells the
// engine, and starts reading.
func (p *partitioned) claim(part int) {
	s := p.s
	lane := strconv.Itoa(part)
	begin := time.Now()
	ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
	rev, err := p.kv.Create(ctx, leaseKey(part), []byte(p.id))
	cancel()
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			// The server may have written it (a timeout, or Close cancelled
			// the request): free it if so.
			p.free(part)
		}
		return // taken meanwhile, or a failure: the next round looks again
	}
	l := &lease{part: part, lane: lane, rev: rev}
	p.kvMu.Lock()
	p.extendLocked(l, begin)
	p.leases[part] = l
	p.kvMu.Unlock()
	driver.Notify(p.check)

	cons, err := p.prepare(part)
	var r *reader
	if err == nil {
		r, err = s.newReader(lane, cons, true)
	}
	p.kvMu.Lock()
	if err != nil || l.lost {
		delete(p.leases, part)
		lost := l.lost
		p.kvMu.Unlock()
		if r != nil {
			r.halt(false)
		}
		if !lost {
			p.deleteLease(part, l.rev)
		}
		return
	}
	r.deadline.Store(l.deadline.UnixNano())
	l.reader = r
	p.kvMu.Unlock()
	s.opts.Lanes.Claimed([]string{lane})
	s.mu.Lock()
	s.readers[lane] = r
	s.mu.Unlock()
	s.startPump(r)
	// The watchdog reports only lanes the engine was told about: one lost
	// meanwhile is reported here.
	p.kvMu.Lock()
	l.claimed = true
	lost := l.lost && !l.releasing
	if lost {
		delete(p.leases, part)
	}
	p.kvMu.Unlock()
	if lost {
		p.reportLost([]*lease{l})
	}
}

// free deletes partition part's lease if it holds this member's ID: a
// write whose outcome is unknown, or a lease the member does not know it
// holds, must not outlive it.
func (p *partitioned) free(part int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.ttl/4)
	defer cancel()
	if e, err := p.kv.Get(ctx, leaseKey(part)); err == nil && string(e.Value()) == p.id {
		_ = p.kv.Delete(ctx, leaseKey(part), jetstream.LastRevision(e.Revision()))
	}
}

// prepare returns partition part's consumer, ready for a new owner.
//
// Deliveries the previous owner left unacknowledged (in flight when it
// crashed, abandoned after its drain bound, or prefetched and never
// handed to its engine) would come back only after AckWait, behind newer
// messages. So when the consumer has any, prepare deletes it and creates
// it again at its ack floor (DeliverByStartSequence = floor + 1): the new
// owner reads them first, in order. Messages above the floor that were
// acknowledged out of order come again too (redeliveries, in order). The
// start is recorded in the group's positions before the delete, so that
// a create that fails leaves the next claim to create the consumer there.
func (p *partitioned) prepare(part int) (jetstream.Consumer, error) {
	s := p.s
	lane := strconv.Itoa(part)
	cons, err := s.consumer(p.ctx, lane)
	if err != nil {
		return nil, err
	}
	info := cons.CachedInfo()
	name := s.consumerName(lane)
	start, ok := resumeSeq(info)
	if info.NumAckPending == 0 || !ok { // nothing to redeliver, or cannot tell where it began (DeliverNew)
		if cfg := info.Config; !pinned(info) && s.c.canPin() {
			// Made before pinning (or on an older server): pin it now.
			s.c.pin(&cfg)
			if up, err := s.c.js.UpdateConsumer(p.ctx, s.ref.name, cfg); err == nil {
				cons = up
			}
		}
		return cons, p.unpin(cons)
	}
	if err := s.pos.raise(p.ctx, lane, start); err != nil {
		return nil, err
	}
	cfg := info.Config
	s.c.pin(&cfg)
	cfg.DeliverPolicy, cfg.OptStartSeq, cfg.OptStartTime = jetstream.DeliverByStartSequencePolicy, start, nil
	if err := s.c.js.DeleteConsumer(p.ctx, s.ref.name, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("reset consumer %q of stream %q at sequence %d: %w", name, s.ref.name, start, classify(err))
	}
	cons, err = s.c.js.CreateConsumer(p.ctx, s.ref.name, cfg)
	if err != nil {
		return nil, fmt.Errorf("reset consumer %q of stream %q at sequence %d: %w", name, s.ref.name, start, classify(err))
	}
	return cons, nil
}

// unpin takes a pinned consumer's pin from whichever client holds it
// (the lane's previous owner), so that the server serves this member's
// pulls from now on and answers the previous owner's with a pin mismatch.
func (p *partitioned) unpin(cons jetstream.Consumer) error {
	info := cons.CachedInfo()
	if !pinned(info) {
		return nil
	}
	st, err := p.s.c.js.Stream(p.ctx, info.Stream)
	if err == nil {
		err = st.UnpinConsumer(p.ctx, info.Name, pinGroup)
	}
	if err != nil {
		return fmt.Errorf("unpin consumer %q of stream %q: %w", info.Name, info.Stream, classify(err))
	}
	return nil
}

// release gives partition part up: the lane stops delivering, the engine
// drains and acknowledges it (Revoked), the server applies those
// acknowledgements, the lane's position is recorded, and the lease is
// deleted so another member can take the partition. Should the lease run
// out meanwhile, the watchdog cuts the drain short.
func (p *partitioned) release(part int) {
	s := p.s
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	p.kvMu.Lock()
	l := p.leases[part]
	if l == nil || !l.claimed || l.lost {
		p.kvMu.Unlock()
		return
	}
	l.releasing, l.revoke = true, cancel
	p.kvMu.Unlock()
	r := l.reader
	r.halt(false)
	driver.Notify(s.wake)
	s.opts.Lanes.Revoked(ctx, []string{l.lane})
	p.kvMu.Lock()
	l.revoke = nil
	p.kvMu.Unlock()
	low := p.detach(r)
	p.settle(p.ctx, r, low)
	s.recordLane(p.ctx, r)
	p.kvMu.Lock()
	delete(p.leases, part)
	lost, rev := l.lost, l.rev
	p.kvMu.Unlock()
	if !lost {
		p.deleteLease(part, rev)
	}
}

func (p *partitioned) deleteLease(part int, rev uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.ttl/4)
	defer cancel()
	_ = p.kv.Delete(ctx, leaseKey(part), jetstream.LastRevision(rev))
}

// detach forgets r after its lane was revoked or lost and returns the
// lowest stream sequence of its deliveries left unacknowledged (0 for
// none).
func (p *partitioned) detach(r *reader) (low uint64) {
	s := p.s
	s.mu.Lock()
	if s.readers[r.lane] == r {
		delete(s.readers, r.lane)
	}
	low = s.lowestHeldLocked(r, true)
	s.mu.Unlock()
	<-r.done
	return low
}

// lowestHeldLocked returns the lowest stream sequence of r's deliveries
// not yet acknowledged, and forgets them when drop is set.
func (s *sub) lowestHeldLocked(r *reader, drop bool) (low uint64) {
	for h := range s.held.all() {
		if h.r != r {
			continue
		}
		if low == 0 || h.seq < low {
			low = h.seq
		}
		if drop {
			s.held.remove(h)
		}
	}
	return low
}

// settle waits, for up to two seconds, until the server has applied the
// acknowledgements this member wrote for r's lane (they are asynchronous),
// so that the lane's next owner, which starts after the ack floor, does
// not read them again. low is the lowest sequence left unacknowledged.
func (p *partitioned) settle(ctx context.Context, r *reader, low uint64) {
	target := r.acked.Load()
	if low > 0 && low-1 < target {
		target = low - 1
	}
	if target == 0 || !r.valid(time.Now()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = p.s.c.nc.FlushWithContext(ctx)
	for {
		info, err := r.consumer().Info(ctx)
		if err != nil || info.NumAckPending == 0 || (info.AckFloor.Consumer > 0 && info.AckFloor.Stream >= target) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// leave releases every lease the member still holds, after its readers
// stopped (Close): it waits for its acknowledgements, records the lanes'
// positions and deletes the leases, then deletes any lease that still
// holds its ID (one whose claim it never learnt the outcome of) and its
// heartbeat.
func (p *partitioned) leave(ctx context.Context) {
	p.kvMu.Lock()
	leases := p.leases
	p.leases = map[int]*lease{}
	p.kvMu.Unlock()
	for _, l := range leases {
		if l.lost {
			continue
		}
		if r := l.reader; r != nil {
			p.s.mu.Lock()
			low := p.s.lowestHeldLocked(r, false)
			p.s.mu.Unlock()
			p.settle(ctx, r, low)
			p.s.recordLane(ctx, r)
		}
		_ = p.kv.Delete(ctx, leaseKey(l.part), jetstream.LastRevision(l.rev))
	}
	for part := range p.parts {
		p.free(part)
	}
	_ = p.kv.Delete(ctx, memberKey(p.id))
}

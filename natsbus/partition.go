package natsbus

// Partitioned mode: joining a group on a partitioned topic, the group's
// lease bucket, and a member's share of the partitions (partitioned,
// lease) with the start and stop of its goroutines and the watcher,
// which mirrors the bucket's keys into view. The refresher and the
// watchdog are in lease.go, the balancer in balance.go, hand-overs in
// handover.go. Lock order: kvMu before sub.mu; viewMu alone.
//
// The lease bucket may be deleted under the member (DeleteGroup, an
// operator): the refresher, when its heartbeat fails, its heartbeat's
// revision drops (a bucket created anew) or a lease is lost, asks the
// watcher to look the bucket up (lookup), and the watcher creates it
// again, gives up the leases that went with the old one and watches the
// new one (restore): the refresher never waits for it.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
)

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
	kv, ttl, created, err := c.leaseBucket(ctx, ref, opts.Group, c.cfg.leaseTTL)
	if err != nil {
		return fail(err)
	}
	pctx, cancel := context.WithCancel(context.Background())
	p := &partitioned{
		s: s, kv: kv, id: omnibus.NewID(), ttl: ttl, every: c.cfg.rebalance, parts: ref.parts,
		ctx: pctx, cancel: cancel, created: created,
		ready:  make(chan struct{}),
		lookup: make(chan struct{}, 1),
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
			_ = c.js.DeleteKeyValue(ctx, s.pos.cfg.Bucket)
		}
	}
	s.startKeeper()
	return keeping{s}, nil
}

// leaseBucket opens, or creates with the TTL want, the KV bucket of
// group's leases and returns it with its TTL and the creation time of its
// stream (which tells it from a bucket of the same name created after
// it). An existing bucket keeps its TTL (the first member to create it
// set it), so every member agrees on it.
func (c *conn) leaseBucket(ctx context.Context, ref *streamRef, group string, want time.Duration) (kv jetstream.KeyValue, ttl time.Duration, created time.Time, err error) {
	name := leaseBucket(ref.name, group)
	kv, err = c.bucket(ctx, jetstream.KeyValueConfig{
		Bucket:      name,
		Description: "omnibus partition leases of group " + group + " on stream " + ref.name,
		TTL:         want,
	})
	if err != nil {
		return nil, 0, time.Time{}, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("lease bucket %q: %w", name, classify(err))
	}
	ttl = st.TTL()
	if ttl < minLeaseTTL {
		return nil, 0, time.Time{}, fmt.Errorf("lease bucket %q has TTL %v; leases need one of at least %v (delete the bucket to have it created again): %w",
			name, ttl, minLeaseTTL, driver.ErrInvalid)
	}
	return kv, ttl, bucketCreated(st), nil
}

// bucketCreated is when the stream of the bucket st describes was
// created; zero if st does not tell.
func bucketCreated(st jetstream.KeyValueStatus) time.Time {
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
		return bs.StreamInfo().Created
	}
	return time.Time{}
}

// partitioned is a member's share of a partitioned topic: the leases it
// holds and the goroutines that keep them.
//
// Goroutines, ended by stop: the watcher (the bucket's keys into view;
// it restores a bucket deleted under the member, and owns and stops
// every key watcher it uses), the refresher (heartbeat and leases,
// written at once, every ttl/4), the balancer (takes and gives up partitions; calls
// Lanes.Claimed and Lanes.Revoked) and the watchdog (gives up a lease at
// its deadline and calls Lanes.Lost, so that a lost lane reaches the
// engine at once, never behind another lane's drain). Lock order: kvMu
// before sub.mu; viewMu alone (the watcher takes kvMu, then viewMu, one
// after the other, never both). No Lanes call is made with a lock held.
type partitioned struct {
	s      *sub
	kv     jetstream.KeyValue // by name: reaches a bucket created again under it
	id     string             // member ID
	ttl    time.Duration
	every  time.Duration
	parts  int
	ctx    context.Context // I/O and Revoked; cancelled by stop
	cancel context.CancelFunc
	ready  chan struct{} // closed when the watcher delivered the initial keys
	wakeup chan struct{} // a lease was lost: balance now
	check  chan struct{} // a lease was claimed or lost: the watchdog looks again
	lookup chan struct{} // the bucket may be gone or new: the watcher looks it up
	wg     sync.WaitGroup

	created time.Time // the watched bucket's stream creation; the watcher's (start's before it runs)
	beat    uint64    // the heartbeat's last revision; the refresher's (start's before it runs)

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
	rev, err := p.kv.Put(ctx, memberKey(p.id), []byte(p.s.c.cfg.name))
	if err != nil {
		return fmt.Errorf("lease bucket %q: heartbeat: %w", p.kv.Bucket(), err)
	}
	p.beat = rev
	w, err := p.kv.WatchAll(p.ctx)
	if err != nil {
		_ = p.kv.Delete(ctx, memberKey(p.id))
		return fmt.Errorf("lease bucket %q: watch: %w", p.kv.Bucket(), err)
	}
	p.wg.Add(4)
	go p.watchLoop(w)
	go p.refreshLoop()
	go p.balanceLoop()
	go p.watchdogLoop()
	return nil
}

// stop ends the lease goroutines; a Revoked in progress returns early.
func (p *partitioned) stop() {
	p.cancel()
	p.wg.Wait()
}

// watchLoop mirrors the bucket's keys into view, from w and then from
// the key watcher of each restore, until stop; it stops the key watcher
// it holds on the way out. It alone writes view and created.
func (p *partitioned) watchLoop(w jetstream.KeyWatcher) {
	defer p.wg.Done()
	defer func() { stopWatch(w) }()
	updates := w.Updates()
	ready := false
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.lookup:
			nw := p.restore()
			if nw == nil {
				continue
			}
			stopWatch(w)
			w, updates = nw, nw.Updates()
			p.viewMu.Lock()
			p.view = map[string]viewEntry{} // the old bucket's keys went with it
			p.viewMu.Unlock()
		case e, ok := <-updates:
			switch {
			case !ok:
				updates = nil // ended under the member: a restore may watch again
			case e == nil: // the initial keys are in view: balance on them
				if !ready {
					ready = true
					close(p.ready)
				}
				driver.Notify(p.wakeup)
			default:
				p.viewMu.Lock()
				if e.Operation() == jetstream.KeyValuePut {
					p.view[e.Key()] = viewEntry{value: string(e.Value()), seen: time.Now()}
				} else {
					delete(p.view, e.Key())
				}
				p.viewMu.Unlock()
			}
		}
	}
}

// stopWatch stops w and reads what it still delivers until it closes its
// updates, so that no delivery of its subscription stays blocked.
func stopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	for range w.Updates() {
	}
}

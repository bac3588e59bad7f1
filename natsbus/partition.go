package natsbus

// Partitioned mode: joining a group on a partitioned topic, the group's
// lease bucket, and a member's share of the partitions (partitioned,
// lease) with the start and stop of its goroutines and the watcher,
// which mirrors the bucket's keys into view. The refresher and the
// watchdog are in lease.go, the balancer in balance.go, hand-overs in
// handover.go. Lock order: kvMu before sub.mu; viewMu alone.

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
			_ = c.js.DeleteKeyValue(ctx, s.pos.cfg.Bucket)
		}
	}
	s.startKeeper()
	return keeping{s}, nil
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

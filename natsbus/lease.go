package natsbus

// Leases: the refresher goroutine writes the member's heartbeat and its
// leases, all at once, every ttl/4; the watchdog goroutine gives a lease up at its
// local deadline and reports the lane lost at once (Lanes.Lost), never
// behind another lane's drain; free and deleteLease serve the balancer
// and Close too. kvMu guards the leases and their fields; Lanes.Lost is
// called with no lock held.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

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

// refresh writes the member's heartbeat and updates every lease it
// holds, each conditional on the revision it wrote last: all at once,
// with one deadline for the round (ttl/4, the refresh period), so that a
// slow or failing write, the heartbeat's or a lease's, never holds
// another lease back, in this round or the next. (One after the other,
// each with a timeout of its own, a slow server could push the last
// lease past its deadline while the first ones waited.) A heartbeat
// that fails, or gets a revision below the last one (a bucket created
// anew), or a lease lost, has the watcher look the bucket up (restore)
// once the round is done; the refresher does not wait for it.
func (p *partitioned) refresh() {
	ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
	defer cancel()
	var rev uint64
	var err error
	var beat sync.WaitGroup
	beat.Go(func() { rev, err = p.kv.Put(ctx, memberKey(p.id), []byte(p.s.c.cfg.name)) })
	lost := p.refreshLeases(ctx)
	beat.Wait()
	if p.ctx.Err() != nil {
		return
	}
	if err != nil || rev <= p.beat || lost {
		driver.Notify(p.lookup)
	}
	if err == nil {
		p.beat = rev
	}
}

// refreshLeases updates the member's leases all at once, within ctx, and
// reports whether it lost any. kvMu is held until every write answered,
// so that release and the watchdog see each lease's revision as written.
func (p *partitioned) refreshLeases(ctx context.Context) (lost bool) {
	p.kvMu.Lock()
	defer p.kvMu.Unlock()
	begin := time.Now()
	type write struct {
		l   *lease
		rev uint64
		err error
	}
	var writes []*write
	var wg sync.WaitGroup
	for _, l := range p.leases {
		if l.lost {
			continue
		}
		part, rev := l.part, l.rev
		if begin.After(l.deadline) || (l.reader != nil && !l.reader.valid(begin)) {
			// Unrefreshed too long: the lease may have expired on the
			// server. Give it up, and free it if it is still ours.
			p.loseLocked(l)
			lost = true
			wg.Go(func() { _ = p.kv.Delete(ctx, leaseKey(part), jetstream.LastRevision(rev)) })
			continue
		}
		w := &write{l: l}
		writes = append(writes, w)
		wg.Go(func() { w.rev, w.err = p.kv.Update(ctx, leaseKey(part), []byte(p.id), rev) })
	}
	wg.Wait()
	if p.ctx.Err() != nil {
		return false
	}
	for _, w := range writes {
		switch {
		case w.err == nil:
			w.l.rev = w.rev
			p.extendLocked(w.l, begin)
		case errors.Is(w.err, jetstream.ErrKeyRevisionMismatch), errors.Is(w.err, jetstream.ErrKeyExists):
			// Expired on the server, and maybe taken.
			p.loseLocked(w.l)
			lost = true
		}
	}
	if lost {
		driver.Notify(p.wakeup)
	}
	return lost
}

// restore looks the lease bucket up when the refresher suspects it was
// deleted or replaced under the member (DeleteGroup, an operator). A
// bucket that is missing it creates again, with the TTL the member
// counts with; one that is not the bucket the member watched (missing,
// or created anew by another member) held none of the member's leases:
// they are lost at once (before a new bucket is created, so that no
// refresh writes an old revision into it), and restore returns a key
// watcher of the new bucket (whose initial keys wake the balancer, which
// claims the partitions again). It returns nil when the bucket is the one
// watched, or when it cannot tell or fails: the next suspicion tries
// again. It runs on the watcher goroutine.
func (p *partitioned) restore() jetstream.KeyWatcher {
	ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
	defer cancel()
	kv, err := p.s.c.js.KeyValue(ctx, p.kv.Bucket())
	switch {
	case err == nil:
		if st, err := kv.Status(ctx); err != nil || bucketCreated(st).Equal(p.created) {
			return nil // the bucket watched, or cannot tell
		}
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil
	}
	p.loseAll()
	kv, _, created, err := p.s.c.leaseBucket(ctx, p.s.ref, p.s.opts.Group, p.ttl)
	if err != nil {
		return nil
	}
	w, err := kv.WatchAll(p.ctx)
	if err != nil {
		return nil
	}
	p.created = created
	return w
}

// abandon gives up the lease of the lane r reads after r failed to read
// it (cause): the lane is lost at once, as if its lease ran out, and the
// lease is deleted, so that the balancer claims the partition again and
// its consumer resumes at its first message not acknowledged (see
// prepare). It runs on r's pump.
func (p *partitioned) abandon(r *reader, cause error) {
	p.kvMu.Lock()
	var l *lease
	for _, x := range p.leases {
		if x.reader == r && !x.lost {
			l = x
		}
	}
	if l == nil { // lost already
		p.kvMu.Unlock()
		r.halt(false)
		return
	}
	p.loseLocked(l)
	part, rev := l.part, l.rev
	p.kvMu.Unlock()
	p.s.c.log.Warn("reading a partition failed; giving the lane up to claim it again in order", "topic", p.s.topic, "lane", l.lane, "err", cause)
	p.deleteLease(part, rev)
}

// loseAll gives up every lease the member holds.
func (p *partitioned) loseAll() {
	p.kvMu.Lock()
	defer p.kvMu.Unlock()
	for _, l := range p.leases {
		if !l.lost {
			p.loseLocked(l)
		}
	}
}

func (p *partitioned) watchdogLoop() {
	defer p.wg.Done()
	driver.Watch(p.ctx, p.check, p.expire)
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

func (p *partitioned) deleteLease(part int, rev uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.ttl/4)
	defer cancel()
	_ = p.kv.Delete(ctx, leaseKey(part), jetstream.LastRevision(rev))
}

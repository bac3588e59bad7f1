package natsbus

// Leases: the refresher goroutine writes the member's heartbeat and its
// leases every ttl/4; the watchdog goroutine gives a lease up at its
// local deadline and reports the lane lost at once (Lanes.Lost), never
// behind another lane's drain; free and deleteLease serve the balancer
// and Close too. kvMu guards the leases and their fields; Lanes.Lost is
// called with no lock held.

import (
	"context"
	"errors"
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

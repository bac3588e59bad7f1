package redisbus

// Leases: the refresher goroutine renews the member's heartbeat and its
// leases every lease_ttl/4 (each lease only while it still holds the
// member's token); the watchdog goroutine gives a lease up at its local
// deadline and reports the lane lost at once (Lanes.Lost), never behind
// another lane's drain. sub.mu guards the lanes' lease fields;
// Lanes.Lost is called with no lock held.

import (
	"context"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// extendLocked records a renewal of l begun at begin. The server expires
// the key ttl after it wrote it, so after begin + ttl; the member stops
// using the lease a quarter of ttl before that.
func (p *partitioned) extendLocked(l *lane, begin time.Time) {
	l.deadline = begin.Add(p.ttl * 3 / 4)
}

// loseLocked marks l lost: it delivers and acknowledges nothing more,
// and the watchdog tells the engine.
func (p *partitioned) loseLocked(l *lane) {
	l.lost = true
	l.off.Store(true)
	l.gone.Store(true)
	driver.Notify(p.check)
}

// fenced is called when a script found l's lease no longer holding the
// member's token: the lane is lost.
func (p *partitioned) fenced(l *lane) {
	p.s.mu.Lock()
	if !l.lost {
		p.loseLocked(l)
	}
	p.s.mu.Unlock()
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

// refresh renews every lease the member holds, in one script call.
func (p *partitioned) refresh() {
	s := p.s
	// The balancer renews the heartbeat too, but its interval may be
	// longer than the lease's life.
	hctx, hcancel := context.WithTimeout(p.ctx, p.ttl/4)
	_ = s.heartbeat(hctx, p.ttl)
	hcancel()
	s.mu.Lock()
	var lanes []*lane
	for _, l := range s.lanes {
		if !l.lost {
			lanes = append(lanes, l)
		}
	}
	s.mu.Unlock()
	if len(lanes) == 0 {
		return
	}
	keys := make([]string, len(lanes))
	args := []any{p.ttl.Milliseconds()}
	for i, l := range lanes {
		keys[i] = l.lease
		args = append(args, l.token)
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
	ok, err := renewScript.Run(ctx, s.c.rdb, keys, args...).Int64Slice()
	cancel()
	if err != nil {
		return // the watchdog gives the leases up at their deadlines
	}
	lost := false
	s.mu.Lock()
	for i, l := range lanes {
		switch {
		case l.lost:
		case i < len(ok) && ok[i] == 1:
			p.extendLocked(l, begin)
		default: // expired on the server, and maybe taken
			p.loseLocked(l)
			lost = true
		}
	}
	s.mu.Unlock()
	if lost {
		driver.Notify(p.wakeup)
	}
	ctx, cancel = context.WithTimeout(p.ctx, p.ttl/4)
	defer cancel()
	_ = s.Ack(ctx, nil) // what failed before
	for _, l := range lanes {
		if !l.gone.Load() {
			s.record(ctx, l)
		}
	}
}

func (p *partitioned) watchdogLoop() {
	defer p.wg.Done()
	driver.Watch(p.ctx, p.check, p.expire)
}

// expire gives up the leases whose deadline passed and tells the engine
// about the lanes lost (a lane being released has its drain cut short
// instead; a lane being claimed is reported by claim). It returns when
// to look again: the earliest deadline.
//
// A lost lane leaves the member's lanes only once Lanes.Lost returned,
// so that the balancer does not claim it again meanwhile: the engine,
// told Claimed before that Lost, would keep its old lane for the new
// claim and then drop it with whatever the new claim delivered into it
// (left pending for the member, which reads on past it).
func (p *partitioned) expire(now time.Time) (next time.Time) {
	s := p.s
	next = now.Add(p.ttl / 4)
	var lost []*lane
	s.mu.Lock()
	for _, l := range s.lanes {
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
			lost = append(lost, l)
		}
	}
	s.mu.Unlock()
	p.reportLost(lost)
	if len(lost) > 0 {
		s.mu.Lock()
		for _, l := range lost {
			if s.lanes[l.id] == l {
				delete(s.lanes, l.id)
			}
		}
		s.mu.Unlock()
		driver.Notify(p.wakeup) // the balancer may claim them again now
	}
	return next
}

// reportLost tells the engine that lanes were lost.
func (p *partitioned) reportLost(lanes []*lane) {
	if len(lanes) == 0 {
		return
	}
	ids := make([]string, len(lanes))
	for i, l := range lanes {
		ids[i] = l.id
	}
	driver.Notify(p.s.wake)
	p.s.opts.Lanes.Lost(ids)
	driver.Notify(p.wakeup)
}

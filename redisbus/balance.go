package redisbus

// Balancing: the balancer goroutine renews the member's heartbeat, takes
// free lanes up to the member's fair share and gives up one above it,
// KCL-style: claim (the lease, Lanes.Claimed, then the reader takes the
// lane over) and release (Lanes.Revoked, then the lease goes). sub.mu
// guards the lanes; no Lanes call is made with it held.

import (
	"context"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

func (p *partitioned) balanceLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.every)
	defer t.Stop()
	for round := 1; p.ctx.Err() == nil; round++ {
		if p.balance() {
			continue // gave one up above the fair share: the next at once
		}
		if round%(reapEvery*4) == 0 {
			ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
			p.s.c.reap(ctx, p.s.topic, p.s.group, p.s.consumer)
			cancel()
		}
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		case <-p.wakeup:
		}
	}
}

// balance takes free lanes up to the member's fair share and gives up
// one above it, by count (driver.Balance). It reports whether it gave one
// up above the share, so the caller goes on at once.
func (p *partitioned) balance() (again bool) {
	s := p.s
	ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
	members, owners, err := p.view(ctx)
	cancel()
	if err != nil {
		if p.ctx.Err() == nil {
			s.c.log.Warn("reading the group's leases failed", "topic", s.topic, "group", s.group, "err", err)
		}
		return false
	}
	mine := make([]bool, s.parts)
	s.mu.Lock()
	for _, l := range s.lanes {
		if !l.lost {
			mine[l.part] = true
		}
	}
	s.mu.Unlock()
	for i, v := range owners {
		owners[i] = ownerOf(v)
	}
	claim, release, again := driver.Balance(s.consumer, members, owners, mine)
	for _, part := range claim {
		p.claim(part)
	}
	if release >= 0 {
		p.release(release)
	}
	return again
}

// ownerOf is the member ID in a lease's value ("<member>/<token>").
func ownerOf(v string) string {
	for i := len(v) - 1; i >= 0; i-- {
		if v[i] == '/' {
			return v[:i]
		}
	}
	return v
}

// claim takes lane part when its lease is free: it writes the lease with
// a new fencing token, tells the engine, and hands the lane to the
// reader, which first takes over what the previous owners left pending.
//
// A lane of that ID still in the member's lanes (lost, the watchdog not
// yet having told the engine, or still draining in release) is not
// claimed again until it is gone from them: a new claim would take its
// place unreported, so that the engine, never told the old claim was
// lost, would keep its deliveries beside the new claim's (and release
// would delete the new claim's lane when its drain ends).
func (p *partitioned) claim(part int) {
	s := p.s
	stream := streamKey(s.topic, part)
	l := &lane{id: laneID(part), part: part, stream: stream, lease: leaseKey(stream, s.group), cursor: "0-0"}
	s.mu.Lock()
	_, present := s.lanes[l.id]
	s.mu.Unlock()
	if present {
		driver.Notify(p.check) // the watchdog reports it; the next round claims
		return
	}
	l.off.Store(true)
	begin := time.Now()
	ctx, cancel := context.WithTimeout(p.ctx, p.ttl/4)
	token, err := acquireScript.Run(ctx, s.c.rdb, []string{l.lease, fenceKey(s.topic, s.group)}, s.consumer, p.ttl.Milliseconds()).Text()
	cancel()
	if err != nil {
		if !isNil(err) {
			// The server may have written it (a timeout, or Close
			// cancelled the request): free it if so.
			p.free(l.lease)
		}
		return // taken meanwhile, or a failure: the next round looks again
	}
	l.token = token
	s.mu.Lock()
	p.extendLocked(l, begin)
	s.lanes[l.id] = l
	s.mu.Unlock()
	driver.Notify(p.check)
	s.opts.Lanes.Claimed([]string{l.id})
	// The watchdog reports only lanes the engine was told about: one lost
	// meanwhile is reported here.
	s.mu.Lock()
	l.claimed = true
	lost := l.lost
	if lost {
		delete(s.lanes, l.id)
	} else {
		l.off.Store(false)
	}
	s.mu.Unlock()
	if lost {
		p.reportLost([]*lane{l})
		return
	}
	driver.Notify(s.kick)
	s.unblock()
}

// release gives lane part up: the lane stops delivering, the engine
// drains and acknowledges it (Revoked), and the lease is deleted so
// another member can take the lane; what the engine did not acknowledge
// stays pending, for the next owner. Should the lease run out meanwhile,
// the watchdog cuts the drain short.
func (p *partitioned) release(part int) {
	s := p.s
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	id := laneID(part)
	s.mu.Lock()
	l := s.lanes[id]
	if l == nil || !l.claimed || l.lost {
		s.mu.Unlock()
		return
	}
	l.releasing, l.revoke = true, cancel
	l.off.Store(true)
	s.mu.Unlock()
	driver.Notify(s.wake)
	s.opts.Lanes.Revoked(ctx, []string{id})
	_ = s.Ack(ctx, nil) // what failed before
	s.mu.Lock()
	l.revoke = nil
	l.gone.Store(true)
	delete(s.lanes, id)
	lost := l.lost
	s.mu.Unlock()
	if !lost {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.ttl/4)
		s.record(ctx, l)
		_ = releaseScript.Run(ctx, s.c.rdb, []string{l.lease}, l.token).Err()
		cancel()
	}
}

// free deletes the lease key if it holds this member's ID under any
// token: a claim whose outcome is unknown must not outlive it.
func (p *partitioned) free(key string) {
	s := p.s
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.ttl/4)
	defer cancel()
	if v, err := s.c.rdb.Get(ctx, key).Result(); err == nil && ownerOf(v) == s.consumer {
		_ = releaseScript.Run(ctx, s.c.rdb, []string{key}, v).Err()
	}
}

package natsbus

// Balancing: the balancer goroutine takes free partitions up to the
// member's fair share and gives up one above it, KCL-style: claim
// (Lanes.Claimed, then the lane's reader starts) and release
// (Lanes.Revoked, then the lease goes). kvMu guards the leases, viewMu
// the view it counts from; no Lanes call is made with a lock held.

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

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
	p.kvMu.Lock()
	old := p.leases[part]
	p.kvMu.Unlock()
	if old != nil {
		return // lost, and the engine not told yet: the watchdog tells it first
	}
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
		r = s.newReader(lane, cons, true)
		if next, ok := resumeSeq(cons.CachedInfo()); ok {
			r.claimAt.Store(next)
		}
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
	s.mu.Lock()
	delete(s.settled, l.lane) // handed over: another member reads it now
	s.mu.Unlock()
	p.kvMu.Lock()
	delete(p.leases, part)
	lost, rev := l.lost, l.rev
	p.kvMu.Unlock()
	if !lost {
		p.deleteLease(part, rev)
	}
}

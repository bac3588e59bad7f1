package redisbus

// Partitioned mode: a member's share of a partitioned topic's lanes,
// held through leases (a Redis key per lane and group), with the start
// and stop of its goroutines and its leaving. The refresher and the
// watchdog are in lease.go, the balancer in balance.go. sub.mu guards
// the lanes and their lease fields; no Lanes call is made with it held.

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// partitioned is a member's share of a partitioned topic.
//
// Goroutines, ended by stop: the balancer (heartbeat, takes and gives up
// lanes; calls Lanes.Claimed and Lanes.Revoked), the refresher (renews
// the leases every lease_ttl/4) and the watchdog (gives a lease up at
// its deadline and calls Lanes.Lost, so that a lost lane reaches the
// engine at once, never behind another lane's drain).
type partitioned struct {
	s      *sub
	ttl    time.Duration
	every  time.Duration
	ctx    context.Context // I/O and Revoked; cancelled by stop
	cancel context.CancelFunc
	wakeup chan struct{} // a lease was lost: balance now
	check  chan struct{} // a lease was taken or lost: the watchdog looks again
	wg     sync.WaitGroup
}

func newPartitioned(s *sub) *partitioned {
	ctx, cancel := context.WithCancel(s.ctx)
	return &partitioned{
		s: s, ttl: s.c.cfg.leaseTTL, every: s.c.cfg.rebalance,
		ctx: ctx, cancel: cancel,
		wakeup: make(chan struct{}, 1),
		check:  make(chan struct{}, 1),
	}
}

func (p *partitioned) start(ctx context.Context) error {
	if _, _, err := p.view(ctx); err != nil {
		return err
	}
	p.wg.Add(3)
	go p.balanceLoop()
	go p.refreshLoop()
	go p.watchdogLoop()
	return nil
}

// stop ends the lease goroutines; a Revoked in progress returns early.
func (p *partitioned) stop() {
	p.cancel()
	p.wg.Wait()
}

// view renews the member's heartbeat and returns the live members and
// each lane's lease value ("" when free).
func (p *partitioned) view(ctx context.Context) (members []string, owners []string, err error) {
	s := p.s
	keys := []string{membersKey(s.topic, s.group)}
	for _, stream := range s.streams() {
		keys = append(keys, leaseKey(stream, s.group))
	}
	v, err := heartbeatScript.Run(ctx, s.c.rdb, keys, s.consumer, p.ttl.Milliseconds()).Slice()
	if err != nil {
		return nil, nil, fmt.Errorf("heartbeat: %w", classify(err))
	}
	if len(v) < 2 {
		return nil, nil, fmt.Errorf("heartbeat: unexpected reply %v", v)
	}
	ms, _ := v[0].([]any)
	for _, m := range ms {
		if id, ok := m.(string); ok {
			members = append(members, id)
		}
	}
	os, _ := v[1].([]any)
	owners = make([]string, s.parts)
	for i := range owners {
		if i < len(os) {
			owners[i], _ = os[i].(string)
		}
	}
	return members, owners, nil
}

// leave releases every lease the member still holds, after its
// goroutines stopped (Close).
func (p *partitioned) leave(ctx context.Context) {
	s := p.s
	s.mu.Lock()
	var held []*lane
	for _, l := range s.lanes {
		l.off.Store(true)
		l.gone.Store(true)
		if !l.lost {
			held = append(held, l)
		}
	}
	clear(s.lanes)
	s.mu.Unlock()
	for _, l := range held {
		s.record(ctx, l)
		_ = releaseScript.Run(ctx, s.c.rdb, []string{l.lease}, l.token).Err()
	}
}

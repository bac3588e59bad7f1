package kinesisbus

// The renewer and the watchdog. The renewer is the member's goroutine
// that increments the counter of every lease it holds every
// failover_time / 3 (each lease in a goroutine of its own, which it waits
// for), finds hand-overs other members asked for (they go to the taker,
// which revokes them), and declares lost, through Lanes.Lost, the leases
// another member took. The watchdog gives a lease up at its deadline
// (extend): 3/4 of failover_time after the start of its last successful
// write, before any other member may take it, and declares it lost at
// once, whatever the renewer's calls are doing. (The taker declares lost
// every lease held when it finds the lease table deleted: restore.)

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// extend records a successful write of sh's lease (its take, a renewal,
// a checkpoint), begun at begin. The write may have landed at any time
// after begin, and another member counts failover_time from when it saw
// the counter move, so from after begin: the member stops using the
// lease at begin + 3/4 failover_time, a quarter of failover_time before
// anyone may take it (room for a handler already running to finish, and
// for clocks that run at slightly different rates). A lease past its
// deadline stays expired, even after a late write lands. The caller holds
// sh.lmu.
func (s *sub) extend(sh *shard, begin time.Time) {
	s.mu.Lock()
	if !sh.expired {
		sh.deadline = s.deadline(begin)
	}
	s.mu.Unlock()
	driver.Notify(s.check)
}

// deadline is when the member stops using a lease whose last successful
// write began at begin (see extend).
func (s *sub) deadline(begin time.Time) time.Time { return begin.Add(s.conn.cfg.failover * 3 / 4) }

// valid reports whether sh's lease may still be used at now.
func (s *sub) valid(sh *shard, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.validLocked(sh, now)
}

// validLocked is valid with sub.mu held; it marks the lease expired once
// its deadline passed.
func (s *sub) validLocked(sh *shard, now time.Time) bool {
	if !sh.expired && !now.Before(sh.deadline) {
		sh.expired = true
	}
	return !sh.expired
}

func (s *sub) renewLoop() {
	defer close(s.renewerDone)
	t := time.NewTicker(s.conn.cfg.failover / 3)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		held := make([]*shard, 0, len(s.held))
		for _, sh := range s.held {
			if !sh.gone {
				held = append(held, sh)
			}
		}
		s.mu.Unlock()
		// In parallel: a slow call must not hold up the other leases'
		// renewals.
		kept := make([]bool, len(held))
		var wg sync.WaitGroup
		for i, sh := range held {
			wg.Go(func() { kept[i] = s.renew(s.ctx, sh) })
		}
		wg.Wait()
		var lost []*shard
		for i, sh := range held {
			if !kept[i] {
				lost = append(lost, sh)
			}
		}
		if len(lost) > 0 && s.ctx.Err() == nil {
			s.lose(lost)
		}
	}
}

// renew renews sh's lease; it reports false when another member took it.
// A lease past its deadline is not renewed: the watchdog gives it up.
func (s *sub) renew(ctx context.Context, sh *shard) bool {
	sh.lmu.Lock()
	defer sh.lmu.Unlock()
	begin := time.Now()
	if !s.valid(sh, begin) {
		return true
	}
	cctx, cancel := context.WithTimeout(ctx, s.conn.leaseTimeout())
	defer cancel()
	err := s.table.renew(cctx, sh.id, sh.counter, s.me, sh.handOver)
	s.nudge(err)
	if errors.Is(err, ErrNotOwner) {
		l, gerr := s.table.get(cctx, sh.id)
		switch {
		case gerr != nil:
			err = gerr
		case l == nil:
			// The lease was deleted behind the member's back.
		case l.counter == sh.counter+1 && s.ours(l, sh.handOver):
			err = nil // our own renewal, sent again by the SDK
		case s.handOverAsked(sh, l):
			// Another member asked for it: drain, checkpoint, hand over.
			return true
		}
	}
	switch {
	case err == nil:
		sh.counter++
		s.extend(sh, begin)
		return true
	case errors.Is(err, ErrNotOwner):
		s.logger.Info("lease taken by another member", "shard", sh.id)
		return false
	case ctx.Err() != nil:
		return true // closing
	}
	s.logger.Debug("renewing a lease failed; trying again", "shard", sh.id, "err", err)
	return true
}

func (s *sub) watchLoop() {
	defer close(s.watchdogDone)
	driver.Watch(s.ctx, s.check, s.expire)
}

// expire gives up the leases past their deadline: a claimed lane is lost
// (Lanes.Lost), a lane draining in Lanes.Revoked has its drain cut short
// (its checkpoints are refused anyway); a lease not claimed yet is lost
// once it is (the taker wakes the watchdog then). It returns when to look
// again: the earliest deadline still ahead.
func (s *sub) expire(now time.Time) (next time.Time) {
	next = now.Add(s.conn.cfg.failover / 4)
	var lost []*shard
	s.mu.Lock()
	for _, sh := range s.held {
		switch {
		case sh.gone:
		case s.validLocked(sh, now):
			if sh.deadline.Before(next) {
				next = sh.deadline
			}
		case sh.revoking:
			if sh.cutDrain != nil {
				sh.cutDrain()
			}
		case sh.claimed:
			lost = append(lost, sh)
		}
	}
	s.mu.Unlock()
	if len(lost) > 0 {
		for _, sh := range lost {
			s.logger.Warn("lease not renewed in time: given up", "shard", sh.id)
		}
		s.lose(lost)
	}
	return next
}

// lose abandons the lanes of shards whose leases are gone: no commit,
// the reader stops, and what it buffered is dropped. The renewer, the
// watchdog and the taker (restore) call it; a shard lost already is
// skipped.
func (s *sub) lose(lost []*shard) {
	s.mu.Lock()
	var ids []string
	for _, sh := range lost {
		if sh.gone {
			continue
		}
		sh.gone = true
		sh.buf, sh.bufBytes = nil, 0
		if s.held[sh.id] == sh {
			delete(s.held, sh.id)
		}
		delete(s.revoke, sh.id)
		ids = append(ids, sh.id)
	}
	s.epoch++
	s.leaving++
	s.mu.Unlock()
	driver.Notify(s.wake)
	for _, sh := range lost {
		s.stopReader(sh)
	}
	if len(ids) > 0 {
		s.lanes.Lost(ids)
	}
	s.mu.Lock()
	s.leaving--
	s.mu.Unlock()
}

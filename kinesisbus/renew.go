package kinesisbus

// The renewer: the member's goroutine that increments the counter of
// every lease it holds every failover_time / 3, finds hand-overs other
// members asked for (they go to the taker, which revokes them), and
// declares lost, through Lanes.Lost, the leases another member took or
// that it could not renew for failover_time. (The taker declares lost
// every lease held when it finds the lease table deleted: restore.)

import (
	"context"
	"errors"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

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
		var lost []*shard
		for _, sh := range held {
			if !s.renew(s.ctx, sh) {
				lost = append(lost, sh)
			}
		}
		if len(lost) > 0 && s.ctx.Err() == nil {
			s.lose(lost)
		}
	}
}

// renew renews sh's lease; it reports false when the lease is lost.
func (s *sub) renew(ctx context.Context, sh *shard) bool {
	sh.lmu.Lock()
	defer sh.lmu.Unlock()
	err := s.table.renew(ctx, sh.id, sh.counter, s.me, sh.handOver)
	s.nudge(err)
	if errors.Is(err, ErrNotOwner) {
		l, gerr := s.table.get(ctx, sh.id)
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
		sh.renewed = time.Now()
		return true
	case errors.Is(err, ErrNotOwner):
		s.logger.Info("lease taken by another member", "shard", sh.id)
		return false
	case ctx.Err() != nil:
		return true
	case time.Since(sh.renewed) >= s.conn.cfg.failover:
		s.logger.Warn("lease not renewed for failover_time: given up", "shard", sh.id, "err", err)
		return false
	}
	s.logger.Debug("renewing a lease failed; trying again", "shard", sh.id, "err", err)
	return true
}

// lose abandons the lanes of shards whose leases are gone: no commit,
// the reader stops, and what it buffered is dropped. The renewer and the
// taker (restore) call it; a shard lost already is skipped.
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

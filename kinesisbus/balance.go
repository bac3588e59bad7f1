package kinesisbus

// The taker: the member's goroutine that lists the stream's shards and
// creates their leases, scans the lease table, takes expired leases up to
// its share, asks the most loaded member for one lease when none is free,
// and revokes the leases it must give up. It alone calls Lanes.Claimed
// and Lanes.Revoked. Its state (seen, lastSync, restoring) is its own.
// It is also the one place where a lease table deleted under the member
// is found missing (its scan; the renewer and Commit only wake it) and
// created again (restore).

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// seenLease is when the taker, on its own clock, last saw a lease's
// counter move: a lease whose counter stayed for failover_time expired.
// Clocks of different hosts are never compared.
type seenLease struct {
	counter int64
	owner   string
	ended   bool      // checkpointed SHARD_END: cleanup may delete it
	at      time.Time // zero: never seen renewed (a new, unowned lease)
}

// takeInterval is how often the taker looks at the lease table.
func (s *sub) takeInterval() time.Duration { return s.conn.cfg.failover / 2 }

func (s *sub) takeLoop() {
	defer close(s.takerDone)
	t := time.NewTicker(s.takeInterval())
	defer t.Stop()
	for {
		select {
		case <-s.takerCtx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		if err := s.round(s.takerCtx, false); err != nil && s.takerCtx.Err() == nil {
			s.logger.Warn("lease round failed; trying again", "err", err)
		}
	}
}

// round is one look at the lease table: revoke what must go, list the
// shards when it is time, take what the balance asks for.
func (s *sub) round(ctx context.Context, first bool) error {
	s.revokePending(ctx)
	s.mu.Lock()
	sync := first || s.syncNow || time.Since(s.lastSync) >= s.conn.cfg.shardSync
	s.syncNow = false
	s.mu.Unlock()
	leases, err := s.table.scan(ctx)
	if errorCode(err) == codeNotFound {
		if err := s.restore(ctx); err != nil {
			return err
		}
		leases, err = s.table.scan(ctx)
	}
	if err != nil {
		return err
	}
	if s.vanished(leases) {
		// Another member found the table missing and created it
		// again: the leases it creates are restoredOwner's, and so are
		// those this member creates.
		s.restoring = true
	}
	sync = sync || s.restoring
	if sync {
		created, err := s.syncShards(ctx, leases)
		if err != nil {
			return err
		}
		if created {
			if leases, err = s.table.scan(ctx); err != nil {
				return err
			}
		}
		s.lastSync = time.Now()
		s.restoring = false // every shard has its lease again
	}
	if leases, err = s.cleanup(ctx, leases, sync); err != nil {
		return err
	}
	take := s.choose(leases, time.Now())
	var claimed []*shard
	for _, l := range take {
		if l.owner != "" && l.owner != s.me && l.checkpointOwner == "" && !s.expired(l, time.Now()) {
			// Held and renewed: ask for it rather than take it.
			if err := s.table.handOver(ctx, l, s.me); err == nil {
				s.logger.Info("asked for a lease", "shard", l.key, "owner", l.owner)
			} else if !errors.Is(err, ErrNotOwner) {
				return err
			}
			continue
		}
		begin := time.Now()
		counter, err := s.table.take(ctx, l, s.me)
		if errors.Is(err, ErrNotOwner) {
			continue // another member was first
		}
		if err != nil {
			return err
		}
		s.seen[l.key] = seenLease{counter: counter, at: time.Now()}
		sh := &shard{id: l.key, counter: counter, space: make(chan struct{}, 1)}
		sh.deadline = s.deadline(begin) // before anyone else sees sh
		if l.owner != "" && l.owner != s.me {
			s.logger.Info("took an expired lease", "shard", l.key, "from", l.owner)
		}
		s.mu.Lock()
		s.held[l.key] = sh
		s.mu.Unlock()
		claimed = append(claimed, sh)
		sh.from = l
	}
	if len(claimed) == 0 {
		return nil
	}
	ids := make([]string, len(claimed))
	for i, sh := range claimed {
		ids[i] = sh.id
	}
	s.lanes.Claimed(ids)
	s.mu.Lock()
	for _, sh := range claimed {
		sh.claimed = true
	}
	s.mu.Unlock()
	driver.Notify(s.check) // one may be past its deadline already
	for _, sh := range claimed {
		s.startReader(sh)
	}
	return nil
}

// restore makes the member go on after its lease table was deleted under
// it (DeleteGroup, an operator): the leases it held went with the table,
// so their lanes are lost (nothing is committed: there is nowhere to), and
// the table is created again as Subscribe creates it. The round goes on
// with a shard sync in restoring mode, which creates the shards' leases
// again where a new group starts, owned by restoredOwner (syncShards):
// other members may still read shards whose leases vanished, until their
// renewals fail, so no one takes those leases before they expire.
func (s *sub) restore(ctx context.Context) error {
	s.restoring = true
	s.mu.Lock()
	held := make([]*shard, 0, len(s.held))
	for _, sh := range s.held {
		held = append(held, sh)
	}
	s.mu.Unlock()
	s.logger.Warn("the lease table is gone: its leases are lost; creating it again", "table", s.table.name, "lost", len(held))
	if len(held) > 0 {
		s.lose(held)
	}
	return s.table.ensure(ctx)
}

// vanished reports whether a lease the taker saw, not read to its end,
// is missing from leases: only a deleted table (or item) loses such a
// lease; cleanup deletes ended ones.
func (s *sub) vanished(leases []*lease) bool {
	have := make(map[string]bool, len(leases))
	for _, l := range leases {
		have[l.key] = true
	}
	for key, seen := range s.seen {
		if !seen.ended && !have[key] {
			return true
		}
	}
	return false
}

// nudge wakes the taker when err says the lease table is missing: its
// next round finds out and restores the table. The renewer and Commit
// call it.
func (s *sub) nudge(err error) {
	if errorCode(err) == codeNotFound {
		driver.Notify(s.kick)
	}
}

// expired reports whether l's counter has not moved for failover_time on
// the taker's clock, or l has no owner.
func (s *sub) expired(l *lease, now time.Time) bool {
	if l.owner == "" && l.checkpointOwner == "" {
		return true
	}
	seen := s.seen[l.key]
	return now.Sub(seen.at) > s.conn.cfg.failover
}

// choose updates what the taker has seen of the leases and returns those
// to take (or, when held by a live member, to ask for): the KCL's
// balance by count. Leases of shards read to their end, and children
// whose parents are not, are not part of it.
func (s *sub) choose(leases []*lease, now time.Time) []*lease {
	byKey := make(map[string]*lease, len(leases))
	for _, l := range leases {
		byKey[l.key] = l
	}
	for key := range s.seen {
		if byKey[key] == nil {
			delete(s.seen, key)
		}
	}
	for _, l := range leases {
		prev, ok := s.seen[l.key]
		switch {
		case !ok && l.owner == "" && l.checkpointOwner == "":
			s.seen[l.key] = seenLease{counter: l.counter, ended: l.ended()} // never renewed
		case !ok || prev.counter != l.counter || l.owner == restoredOwner && prev.owner != restoredOwner:
			// Moved, or created again after it vanished (its counter
			// may be the one seen last): it expires from now.
			s.seen[l.key] = seenLease{counter: l.counter, owner: l.owner, ended: l.ended(), at: now}
		}
	}
	s.mu.Lock()
	held := make(map[string]bool, len(s.held))
	for id := range s.held {
		held[id] = true
	}
	s.mu.Unlock()

	var active []*lease
	for _, l := range leases {
		if !l.ended() && parentsDone(l, byKey) {
			active = append(active, l)
		}
	}
	if len(active) == 0 {
		return nil
	}
	counts := map[string]int{s.me: 0}
	var free, adopt []*lease
	for _, l := range active {
		switch {
		case held[l.key]:
			counts[s.me]++
		case l.owner == s.me && l.checkpointOwner == "":
			adopt = append(adopt, l) // handed over to us
			counts[s.me]++
		case s.expired(l, now):
			free = append(free, l)
		case l.owner == restoredOwner:
			// No member's: free once it expired, never asked for.
		default:
			counts[l.owner]++
		}
	}
	target := 1
	if workers := len(counts); workers < len(active) {
		target = (len(active) + workers - 1) / workers
	}
	need := target - counts[s.me]
	take := adopt
	if need <= 0 {
		return take
	}
	rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	if len(free) > 0 {
		return append(take, free[:min(need, len(free))]...)
	}
	// Nothing free: ask the most loaded member for one lease, as the
	// KCL steals (at most one at a time).
	most, mostCount := "", 0
	for owner, n := range counts {
		if owner != s.me && (n > mostCount || n == mostCount && owner < most) {
			most, mostCount = owner, n
		}
	}
	if most == "" || mostCount < target || mostCount-target == 0 && need <= 1 {
		return take
	}
	var candidates []*lease
	for _, l := range active {
		if l.owner == most && l.checkpointOwner == "" {
			candidates = append(candidates, l)
		}
	}
	if len(candidates) == 0 {
		return take
	}
	return append(take, candidates[rand.IntN(len(candidates))])
}

// parentsDone reports whether every parent of l was read to its end: its
// lease is checkpointed SHARD_END, or it has none (a parent the group
// never read: it closed before the group started at LATEST, or left the
// stream).
func parentsDone(l *lease, byKey map[string]*lease) bool {
	for _, p := range l.parents {
		if pl := byKey[p]; pl != nil && !pl.ended() {
			return false
		}
	}
	return true
}

// syncShards creates the leases of shards that have none, parents first:
// a child of a leased shard from its start (TRIM_HORIZON), once its
// parents end; any other shard where the group starts (TRIM_HORIZON for
// StartEarliest, the time of creation for StartLatest, skipping shards
// already closed). They are unowned, or restoredOwner's while the member
// restores a table deleted under it. It reports whether it created any.
func (s *sub) syncShards(ctx context.Context, leases []*lease) (bool, error) {
	shards, err := s.conn.listShards(ctx, s.stream)
	if err != nil {
		return false, err
	}
	s.listed = shards
	have := make(map[string]bool, len(leases))
	for _, l := range leases {
		have[l.key] = true
	}
	// A shard with a leased descendant was read to its end (its lease
	// may have been cleaned up since): it gets no lease again. The
	// listing has parents before children, so one pass backwards finds
	// them.
	covered := make(map[string]bool)
	for i := len(shards) - 1; i >= 0; i-- {
		if have[shards[i].id] || covered[shards[i].id] {
			for _, p := range shards[i].parents {
				covered[p] = true
			}
		}
	}
	created := false
	now := s.conn.clock().UnixMilli()
	for _, si := range shards {
		if have[si.id] || covered[si.id] {
			continue
		}
		owner := ""
		if s.restoring {
			// The table was deleted: whoever held the shard's lease may
			// still read it until its renewal fails.
			owner = restoredOwner
		}
		checkpoint := ""
		switch {
		case slices.ContainsFunc(si.parents, func(p string) bool { return have[p] }):
			checkpoint = TrimHorizon
		case s.start == driver.StartEarliest:
			checkpoint = TrimHorizon
		case !si.closed:
			checkpoint = AtTimestamp
		default:
			continue
		}
		ok, err := s.table.create(ctx, si, owner, checkpoint, now)
		if err != nil {
			return created, err
		}
		have[si.id] = true
		created = created || ok
	}
	return created, nil
}

// revokePending revokes the lanes of leases that must go: hand-overs
// other members asked for, and shards read to their end. The engine
// drains them and commits (through Commit) before Revoked returns; the
// leases are then released.
func (s *sub) revokePending(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*s.conn.cfg.failover+time.Minute)
	defer cancel()
	s.mu.Lock()
	var out []*shard
	for id, sh := range s.revoke {
		delete(s.revoke, id)
		if s.held[id] == sh && !sh.gone {
			sh.revoking = true
			// The watchdog cuts the drain short when the lease passes
			// its deadline (for every lane of this Revoked).
			sh.cutDrain = cancel
			sh.buf, sh.bufBytes = nil, 0
			out = append(out, sh)
		}
	}
	if len(out) == 0 {
		s.mu.Unlock()
		return
	}
	s.epoch++
	s.leaving++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.leaving--
		s.mu.Unlock()
	}()
	driver.Notify(s.wake) // a Receive in progress returns
	ids := make([]string, len(out))
	for i, sh := range out {
		ids[i] = sh.id
		s.stopReader(sh)
	}
	slices.Sort(ids)
	s.lanes.Revoked(rctx, ids)
	cancel()
	s.mu.Lock()
	for _, sh := range out {
		sh.gone = true
		if s.held[sh.id] == sh {
			delete(s.held, sh.id)
		}
	}
	s.mu.Unlock()
	// Released even when the member is closing meanwhile (Close skips
	// these leases, no longer held): the lanes were drained and
	// committed, and each release is bounded by leaseTimeout.
	rel := context.WithoutCancel(ctx)
	for _, sh := range out {
		s.release(rel, sh)
		s.logger.Info("gave up a lease", "shard", sh.id, "ended", sh.finished)
	}
}

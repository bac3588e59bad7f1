package kafkabus

// Lanes: franz-go's assign, revoke and lost callbacks, run by kgo's group
// management goroutine one at a time, turned into the engine's Lanes
// calls; a new group's start offsets are pinned on first claim. The owned
// partitions are guarded by sub.mu, and sub.gate keeps a commit from
// running after its partition left.

import (
	"context"
	"slices"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func lanesOf(ps []int32) []string {
	ls := make([]string, len(ps))
	for i, p := range ps {
		ls[i] = laneName(p)
	}
	return ls
}

// onAssigned is kgo's OnPartitionsAssigned: it runs before fetching of
// the added partitions starts.
func (s *sub) onAssigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	defer s.joinOnce.Do(func() { close(s.joined) })
	ps := assigned[s.topic]
	if len(ps) == 0 {
		return
	}
	slices.Sort(ps)
	fctx, cancel := context.WithTimeout(ctx, s.conn.cfg.requestTimeout)
	committed, err := s.conn.adm.FetchOffsets(fctx, s.group)
	cancel()
	if err == nil {
		if s.start == driver.StartLatest {
			s.pinStart(ctx, cl, ps, committed)
		}
		s.noteHeads(committed, ps)
	}
	s.mu.Lock()
	for _, p := range ps {
		s.owned[p] = true
	}
	s.mu.Unlock()
	s.lanes.Claimed(lanesOf(ps))
}

// pinStart commits a starting offset for the partitions of ps the group
// has never committed, before kgo reads the group's offsets: the end of
// the partition when the group has no commit on the topic at all (a new
// group starts at the latest message), the start of the partition when it
// has commits on other partitions (a partition added after the group
// started is read from its beginning). Committing the start makes "latest"
// stable: a member that fails before its first commit does not make the
// next owner skip what arrived in between. Failures leave kgo's reset
// offset (the end) in charge.
func (s *sub) pinStart(ctx context.Context, cl *kgo.Client, ps []int32, committed kadm.OffsetResponses) {
	ctx, cancel := context.WithTimeout(ctx, s.conn.cfg.requestTimeout)
	defer cancel()
	adm := s.conn.adm
	any := false
	var missing []int32
	for _, p := range ps {
		if o, ok := committed.Lookup(s.topic, p); ok && o.Err == nil && o.At >= 0 {
			continue
		}
		missing = append(missing, p)
	}
	if len(missing) == 0 {
		return
	}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.Topic == s.topic && o.Err == nil && o.At >= 0 {
			any = true
		}
	})
	list := adm.ListEndOffsets
	if any {
		list = adm.ListStartOffsets
	}
	listed, err := list(ctx, s.topic)
	if err != nil {
		return
	}
	offs := map[int32]kgo.EpochOffset{}
	for _, p := range missing {
		if o, ok := listed.Lookup(s.topic, p); ok && o.Err == nil && o.Offset >= 0 {
			offs[p] = kgo.EpochOffset{Epoch: -1, Offset: o.Offset}
		}
	}
	if len(offs) > 0 {
		cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{s.topic: offs}, nil)
	}
}

// onRevoked is kgo's OnPartitionsRevoked. kgo has stopped fetching the
// partitions and dropped what it buffered of them; the engine drains the
// lanes and commits through Commit before this returns, and only then
// can the group hand the partitions to another member.
func (s *sub) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	ps := s.drop(revoked[s.topic])
	if len(ps) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.conn.cfg.rebalanceTimeout)
	defer cancel()
	s.lanes.Revoked(rctx, lanesOf(ps))
	s.disown(ps)
}

// onLost is kgo's OnPartitionsLost: the session is gone, nothing can be
// committed.
func (s *sub) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	ps := s.drop(lost[s.topic])
	if len(ps) == 0 {
		return
	}
	s.disown(ps)
	s.lanes.Lost(lanesOf(ps))
}

// drop marks the owned partitions of ps revoked, so Receive returns none
// of their records from now on, and returns them.
func (s *sub) drop(ps []int32) []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int32
	for _, p := range ps {
		if s.owned[p] {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil
	}
	s.epoch++
	for _, p := range out {
		s.revokedAt[p] = s.epoch
	}
	if s.interrupt != nil {
		s.interrupt() // the engine waits for a Receive in progress
	}
	slices.Sort(out)
	return out
}

// disown forgets ps once no commit for them is running.
func (s *sub) disown(ps []int32) {
	s.gate.Lock()
	s.mu.Lock()
	for _, p := range ps {
		delete(s.owned, p)
		delete(s.heads, p)
	}
	s.mu.Unlock()
	s.gate.Unlock()
}

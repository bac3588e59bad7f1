package kafkabus

// Attempts across holders (driver.AttemptKeeper): Kafka counts no
// deliveries, so the group's committed offset of a partition carries, in
// its commit metadata, how many holders began the record at that offset
// without settling it, and which member recorded the last of them
// ("omnibus-begun <offset> <holders> <member>"; records written before
// the member was named have no <member>). A member reads it when it
// claims the partition (onAssigned), records its own claim when the
// record at the committed offset is first delivered (Receive), and
// records each record the engine begins while it guards the lane
// (Begin). A member that lost the partition and claimed it again, and
// finds itself the last recorded holder, is alive: it did not crash on
// the record, and is not counted twice. Any other commit moves the
// offset and drops the record. The heads are guarded by sub.mu; the
// commits run on the caller's goroutine with sub.gate held shared, as
// Commit's do.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus/driver"
)

const begunPrefix = "omnibus-begun "

// head is what a member knows of a partition's committed offset: the
// offset (-1: none yet), how many holders began its record, the member
// that recorded the last of them ("" unknown), and whether this member
// still has to record its own claim (at the first delivery).
type head struct {
	offset int64
	begun  int
	member string
	claim  bool
}

// newMemberID names a sub in the records it writes, for the sub's life:
// 8 random bytes in hex.
func newMemberID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// begunMeta is the commit metadata saying that n holders began the
// record at offset, the last of them member.
func begunMeta(offset int64, n int, member string) string {
	return begunPrefix + strconv.FormatInt(offset, 10) + " " + strconv.Itoa(n) + " " + member
}

// parseBegun reads commit metadata: the holders that began the record at
// offset and the member that recorded the last of them ("" when the
// record does not say), or 0 when the metadata is about another offset,
// or none of omnibus's.
func parseBegun(meta string, offset int64) (int, string) {
	rest, ok := strings.CutPrefix(meta, begunPrefix)
	if !ok {
		return 0, ""
	}
	f := strings.Fields(rest)
	if len(f) != 2 && len(f) != 3 {
		return 0, ""
	}
	o, err1 := strconv.ParseInt(f[0], 10, 64)
	c, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || o != offset || c < 0 {
		return 0, ""
	}
	if len(f) == 3 {
		return c, f[2]
	}
	return c, ""
}

// noteHeads records, for the partitions ps just claimed, the group's
// committed offsets and what their metadata says was begun there.
func (s *sub) noteHeads(committed kadm.OffsetResponses, ps []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ps {
		o, ok := committed.Lookup(s.topic, p)
		if !ok || o.Err != nil || o.At < 0 {
			// No commit yet: the partition starts where the group's start
			// says, and nobody began anything there.
			s.heads[p] = head{offset: -1, claim: true}
			continue
		}
		n, member := parseBegun(o.Metadata, o.At)
		s.heads[p] = head{offset: o.At, begun: n, member: member, claim: true}
	}
}

// claim gives each delivery of ds that is the first of its partition at
// the committed offset its Attempt: the holders that began it, plus this
// one unless it is the last recorded (it began the record, lost the
// partition and claimed it again: counted already). It records this
// member's claims only where none did (Begin records a suspect's when it
// runs), all in one commit. Other deliveries are left alone. A failed
// record leaves its delivery uncounted (Attempt 0): the count is a
// safeguard, not a reason to stop.
func (s *sub) claim(ctx context.Context, ds []*driver.Delivery) {
	var firsts []*driver.Delivery
	var at []position
	s.mu.Lock()
	for _, d := range ds {
		pos := d.Token.(*position)
		h, ok := s.heads[pos.partition]
		if !ok || !h.claim {
			continue
		}
		h.claim = false
		s.heads[pos.partition] = h
		switch {
		case h.offset < 0: // no commit: the group starts here
		case pos.offset != h.offset:
			continue // the committed offset was out of range: nothing began here
		case h.begun > 0 && h.member == s.member:
			// Begun by this member before it lost the partition: alive,
			// it did not crash on the record, and it is counted already.
			d.Attempt = h.begun
			continue
		case h.begun > 0:
			// Begun before: a suspect, recorded by Begin when it runs.
			d.Attempt = h.begun + 1
			continue
		}
		firsts, at = append(firsts, d), append(at, *pos)
	}
	s.mu.Unlock()
	if len(firsts) == 0 {
		return
	}
	for i, err := range s.record(ctx, at, 1) {
		if err != nil {
			s.conn.log.Warn("recording a partition claim's first record failed; it runs uncounted", "topic", s.topic, "partition", at[i].partition, "err", err)
			continue
		}
		firsts[i].Attempt = 1
	}
}

// Begin implements driver.AttemptKeeper: d's offset is the committed
// offset (the engine committed the lane up to it), so it records one
// more holder beginning it, unless this member is the last recorded
// (counted already).
func (s *sub) Begin(ctx context.Context, d *driver.Delivery) (int, error) {
	pos, ok := d.Token.(*position)
	if !ok {
		return 0, fmt.Errorf("kafkabus: begin %q: delivery of lane %q is not from kafkabus: %w", s.topic, d.Lane, driver.ErrInvalid)
	}
	s.mu.Lock()
	h := s.heads[pos.partition]
	s.mu.Unlock()
	n := 1
	if h.offset == pos.offset {
		if h.begun > 0 && h.member == s.member {
			return h.begun, nil
		}
		n = h.begun + 1
	}
	if err := s.record(ctx, []position{*pos}, n)[0]; err != nil {
		return 0, err
	}
	return n, nil
}

// record commits each of at's offsets, in one request, with the metadata
// saying that n holders began it, the last this one (s.member), as this
// member of the group's current generation; it returns each one's error.
func (s *sub) record(ctx context.Context, at []position, n int) []error {
	errs := make([]error, len(at))
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("kafkabus: begin %q partition %d group %q: %w", s.topic, at[i].partition, s.group, err)
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	id, err := s.topicID(ctx)
	if err != nil {
		for i := range at {
			errs[i] = err
		}
		return errs
	}
	member, generation := s.cl.GroupMetadata()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation, req.MemberID = s.group, generation, member
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = s.topic, id // by ID from OffsetCommit v10 on
	index := map[int32]int{}
	s.mu.Lock()
	for i, pos := range at {
		if !s.owned[pos.partition] {
			errs[i] = fmt.Errorf("kafkabus: begin %q partition %d: %w", s.topic, pos.partition, ErrNotOwner)
			continue
		}
		meta := begunMeta(pos.offset, n, s.member)
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = pos.partition, pos.offset, pos.epoch, &meta
		rt.Partitions = append(rt.Partitions, rp)
		index[pos.partition] = i
	}
	s.mu.Unlock()
	if len(rt.Partitions) == 0 {
		return errs
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, s.cl)
	if err != nil {
		for _, i := range index {
			fail(i, classify(err))
		}
		return errs
	}
	answered := map[int32]bool{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			i, ok := index[p.Partition]
			if !ok {
				continue
			}
			answered[p.Partition] = true
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				fail(i, classify(err))
			}
		}
	}
	s.mu.Lock()
	for p, i := range index {
		switch {
		case !answered[p]:
			fail(i, errors.New("no answer for the partition"))
		case errs[i] == nil:
			s.heads[p] = head{offset: at[i].offset, begun: n, member: s.member}
		}
	}
	s.mu.Unlock()
	return errs
}

// topicID returns the topic's ID, read once.
func (s *sub) topicID(ctx context.Context) ([16]byte, error) {
	s.mu.Lock()
	id := s.id
	s.mu.Unlock()
	if id != ([16]byte{}) {
		return id, nil
	}
	td, err := s.conn.adm.ListTopics(ctx, s.topic)
	if err == nil {
		err = td.Error()
	}
	if err != nil {
		return id, fmt.Errorf("kafkabus: topic %q: %w", s.topic, classify(err))
	}
	id = td[s.topic].ID
	s.mu.Lock()
	s.id = id
	s.mu.Unlock()
	return id, nil
}

package redisbus

// The reader: the member's goroutine that reads for Receive, on a
// connection of its own (a blocking read holds it; Close closes it to
// end one, and a new lane unblocks it with CLIENT UNBLOCK). It reads
// once per request of Receive, so the member holds at most one read's
// entries beyond the engine's. Unpartitioned it claims entries idle for
// claim_idle (left by members that died) and reads new ones with
// XREADGROUP BLOCK; partitioned it takes over the pending entries of
// each lane it claimed, then reads new ones with a script that checks
// the lease, and waits for more with XREAD BLOCK. The lanes' cursor,
// last and after fields are its own; sub.mu guards the lanes map and
// the held set.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/driver"
)

// maxRead bounds the entries one read asks for, per stream.
const maxRead = 4096

// readBlock bounds how long one blocking read waits.
const readBlock = 2 * time.Second

type readResult struct {
	ds  []*driver.Delivery
	err error
}

// claimEvery is how often an unpartitioned member looks for entries
// idle for claim_idle: a quarter of it, at most 5 seconds.
func (s *sub) claimEvery() time.Duration {
	return min(s.c.cfg.claimIdle/4, 5*time.Second)
}

func (s *sub) readLoop() {
	defer s.wg.Done()
	defer close(s.readerDone)
	var lastClaim time.Time
	cursor := "0-0"
	for {
		var n int
		select {
		case n = <-s.want:
		case <-s.ctx.Done():
			return
		}
		n = min(n, maxRead)
		var r readResult
		for s.ctx.Err() == nil && len(r.ds) == 0 && r.err == nil {
			if s.parts > 0 {
				r.ds, r.err = s.readPartitions(n)
				continue
			}
			if time.Since(lastClaim) >= s.claimEvery() {
				var next string
				r.ds, next, r.err = s.claimIdle(cursor, n)
				if r.err == nil {
					if next == "0-0" {
						lastClaim = time.Now() // scanned to the end: wait before the next scan
					}
					cursor = next
				}
				if len(r.ds) > 0 || r.err != nil {
					continue
				}
			}
			r.ds, r.err = s.readNew(n)
		}
		if s.ctx.Err() != nil {
			return
		}
		select {
		case s.results <- r:
		case <-s.ctx.Done():
			return
		}
	}
}

// readNew reads up to n new entries of the unpartitioned stream, waiting
// up to the claim interval for one.
func (s *sub) readNew(n int) ([]*driver.Delivery, error) {
	l := s.lane(unorderedLane)
	res, err := s.rd.XReadGroup(s.ctx, &redis.XReadGroupArgs{
		Group: s.group, Consumer: s.consumer, Streams: []string{l.stream, ">"},
		Count: int64(n), Block: min(readBlock, s.claimEvery()),
	}).Result()
	switch {
	case isNil(err):
		return nil, nil
	case isNoGroup(err) && s.ctx.Err() == nil:
		return nil, s.rejoin([]*lane{l}, err)
	case err != nil:
		return nil, s.readErr(l.stream, err)
	}
	count := 0
	for _, st := range res {
		count += len(st.Messages)
	}
	// One allocation for the read's deliveries, not one each (it lives
	// while the engine holds one of them: at most a read's worth of
	// Delivery structs; their bodies are separate).
	all := make([]driver.Delivery, count)
	ds := make([]*driver.Delivery, 0, count)
	for _, st := range res {
		for _, m := range st.Messages {
			d := &all[len(ds)]
			decode(d, l, m.ID, m.Values, 1)
			ds = append(ds, d)
		}
	}
	s.hold(ds)
	return ds, nil
}

// readErr wraps an error of a read of stream. After Close it is
// errClosed, whatever the connection said.
func (s *sub) readErr(stream string, err error) error {
	if s.ctx.Err() != nil {
		return errClosed
	}
	return fmt.Errorf("redisbus: read stream %q group %q: %w", stream, s.group, classify(err))
}

// hold records ds as held by the member (unpartitioned), for the keeper.
func (s *sub) hold(ds []*driver.Delivery) {
	if s.parts > 0 || len(ds) == 0 {
		return
	}
	s.mu.Lock()
	for _, d := range ds {
		s.held[d.Position] = struct{}{}
	}
	s.mu.Unlock()
}

// activeLanes are the lanes the member delivers from, by partition.
func (s *sub) activeLanes() []*lane {
	s.mu.Lock()
	var lanes []*lane
	for _, l := range s.lanes {
		if !l.off.Load() {
			lanes = append(lanes, l)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(lanes, func(a, b *lane) int { return a.part - b.part })
	return lanes
}

func (s *sub) lane(id string) *lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lanes[id]
}

// claimIdle claims up to n entries of the unpartitioned stream idle for
// claim_idle, from cursor, and returns them with the next cursor.
func (s *sub) claimIdle(cursor string, n int) ([]*driver.Delivery, string, error) {
	l := s.lane(unorderedLane)
	ds, next, ok, err := s.claim(l, cursor, n, s.c.cfg.claimIdle, false)
	if isNoGroup(err) && s.ctx.Err() == nil {
		return nil, "0-0", s.rejoin([]*lane{l}, err)
	}
	if err == nil && !ok {
		err = fmt.Errorf("redisbus: claim on stream %q: no reply", l.stream)
	}
	// XAUTOCLAIM takes from every consumer, this member's too: an entry
	// it holds (its keeper late) is its own still, not a new delivery.
	s.mu.Lock()
	ds = slices.DeleteFunc(ds, func(d *driver.Delivery) bool {
		_, mine := s.held[d.Position]
		return mine
	})
	s.mu.Unlock()
	s.hold(ds)
	return ds, next, err
}

// claim runs claimScript on lane l's stream: up to n entries from
// cursor idle for at least idle, with their delivery counts as attempts.
// With fence, only while the lane's lease holds its token; ok is false
// when it does not.
func (s *sub) claim(l *lane, cursor string, n int, idle time.Duration, fence bool) (ds []*driver.Delivery, next string, ok bool, err error) {
	keys := []string{l.stream, runsKey(l.stream, s.group)}
	args := []any{s.group, s.consumer, idle.Milliseconds(), cursor, n}
	if fence {
		keys = append(keys, l.lease)
		args = append(args, l.token)
	}
	v, err := claimScript.Run(s.ctx, s.rd, keys, args...).Slice()
	switch {
	case isNil(err):
		return nil, "", false, nil
	case err != nil:
		return nil, "", false, s.readErr(l.stream, err)
	case len(v) < 4:
		return nil, "", false, fmt.Errorf("redisbus: claim on stream %q: unexpected reply %v", l.stream, v)
	}
	next, _ = v[0].(string)
	entries, _ := v[1].([]any)
	counts, _ := v[2].([]any)
	for i, e := range entries {
		attempt := 1
		if i < len(counts) {
			if c, ok := counts[i].(int64); ok {
				attempt = int(c)
			}
		}
		if d := entry(l, e, attempt); d != nil {
			ds = append(ds, d)
		}
	}
	if deleted, _ := v[3].([]any); len(deleted) > 0 {
		s.c.log.Warn("pending entries were trimmed from the stream before they were acknowledged",
			"stream", l.stream, "group", s.group, "count", len(deleted), "first", deleted[0])
	}
	return ds, next, true, nil
}

// entry decodes one entry of a script's reply, [id, [field, value, ...]].
func entry(l *lane, e any, attempt int) *driver.Delivery {
	kv, _ := e.([]any)
	if len(kv) < 2 {
		return nil
	}
	id, _ := kv[0].(string)
	fields, _ := kv[1].([]any)
	if id == "" {
		return nil
	}
	return decodePairs(l, id, fields, attempt)
}

// readPartitions reads up to n entries of each lane the member holds:
// first what a lane's previous owners left pending (in ID order, before
// anything new), then new entries through readScript, which checks each
// lease; when nothing came, it waits for new entries with XREAD BLOCK.
// A lane whose lease is no longer the member's is reported lost.
func (s *sub) readPartitions(n int) ([]*driver.Delivery, error) {
	lanes := s.activeLanes()
	if len(lanes) == 0 {
		select {
		case <-s.kick:
		case <-s.ctx.Done():
		}
		return nil, nil
	}
	// A claim may come back empty with the scan not at its end (what it
	// looked at had been trimmed): the lane's takeover goes on until it
	// ends, before anything new of the lane is read.
	for _, l := range lanes {
		for l.cursor != "" {
			ds, next, ok, err := s.claim(l, l.cursor, n, 0, true)
			if isNoGroup(err) && s.ctx.Err() == nil {
				return nil, s.rejoin(lanes, err)
			}
			if err != nil {
				return nil, err
			}
			if !ok {
				s.part.fenced(l)
				break
			}
			if next == "0-0" {
				next = ""
			}
			l.cursor = next
			if len(ds) > 0 {
				l.last = ds[len(ds)-1].Position
				return ds, nil
			}
		}
	}
	keys := make([]string, 0, 2*len(lanes))
	args := []any{s.group, s.consumer, n}
	for _, l := range lanes {
		keys = append(keys, l.stream, l.lease)
		args = append(args, l.token)
	}
	v, err := readScript.Run(s.ctx, s.rd, keys, args...).Slice()
	if isNoGroup(err) && s.ctx.Err() == nil {
		return nil, s.rejoin(lanes, err)
	}
	if err != nil {
		// The reply may be lost after the server read: what it read is
		// pending for the member, after each lane's last entry. Take it
		// over first, next time.
		for _, l := range lanes {
			l.cursor = after(l.last)
		}
		return nil, s.readErr(s.topic, err)
	}
	var ds []*driver.Delivery
	var waiting []*lane
	for i, l := range lanes {
		var r []any
		if i < len(v) {
			r, _ = v[i].([]any)
		}
		if len(r) < 2 {
			s.part.fenced(l)
			continue
		}
		entries, _ := r[0].([]any)
		for _, e := range entries {
			if d := entry(l, e, 1); d != nil {
				ds = append(ds, d)
				l.last = d.Position
			}
		}
		l.after, _ = r[1].(string)
		waiting = append(waiting, l)
	}
	if len(ds) > 0 || len(waiting) == 0 {
		return ds, nil
	}
	waits := make([]string, 0, 2*len(waiting))
	for _, l := range waiting {
		waits = append(waits, l.stream)
	}
	for _, l := range waiting {
		waits = append(waits, l.after)
	}
	err = s.rd.XRead(s.ctx, &redis.XReadArgs{Streams: waits, Count: 1, Block: readBlock}).Err()
	if err != nil && !isNil(err) {
		return nil, s.readErr(s.topic, err)
	}
	return nil, nil
}

// after returns the stream ID just after id ("0-0" for none: the start).
func after(id string) string {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok {
		return "0-0"
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return "0-0"
	}
	return ms + "-" + strconv.FormatUint(n+1, 10)
}

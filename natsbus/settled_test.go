package natsbus

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus/driver"
)

// TestSettledLanes: a lane remembers what was acknowledged while an
// earlier message was unsettled, by sequence and ID; an acknowledgement
// with nothing earlier unsettled, and the consumer's ack floor, forget
// what lies below them.
func TestSettledLanes(t *testing.T) {
	s := settledLanes{}
	s.settleLocked("0", 5, "e", 2) // 2 unsettled: remembered
	s.settleLocked("0", 4, "d", 2)
	s.settleLocked("0", 7, "g", 2)
	s.settleLocked("0", 9, "", 2)  // no ID: nothing to tell it by
	s.settleLocked("1", 3, "c", 0) // in order: not remembered
	for _, c := range []struct {
		lane string
		seq  uint64
		id   string
		want bool
	}{
		{"0", 4, "d", true}, {"0", 5, "e", true}, {"0", 7, "g", true},
		{"0", 5, "other", false}, // another stream's message at 5
		{"0", 6, "f", false}, {"0", 9, "", false}, {"1", 3, "c", false},
	} {
		if got := s.settledLocked(c.lane, c.seq, c.id); got != c.want {
			t.Errorf("settled(%s, %d, %q) = %v, want %v", c.lane, c.seq, c.id, got, c.want)
		}
	}
	s.settleLocked("0", 6, "f", 0) // 2 settled since: 6 in order forgets 4 and 5
	if s.settledLocked("0", 4, "d") || s.settledLocked("0", 5, "e") || s.settledLocked("0", 6, "f") || !s.settledLocked("0", 7, "g") {
		t.Errorf("after an in-order ack of 6: %v, want only 7 left", s["0"])
	}
	s.forgetLocked("0", 7)
	if _, ok := s["0"]; ok {
		t.Errorf("after the floor passed 7: %v, want the lane forgotten", s["0"])
	}
}

// fakeMsg is a delivery of stream sequence seq, consumer sequence cseq,
// of message ID id, that counts its acknowledgements.
type fakeMsg struct {
	seq, cseq uint64
	id        string
	acks      *int
}

func (f fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: f.seq, Consumer: f.cseq}, NumDelivered: 1}, nil
}
func (f fakeMsg) Data() []byte                     { return []byte("x") }
func (f fakeMsg) Headers() nats.Header             { return nats.Header{HeaderID: []string{f.id}} }
func (f fakeMsg) Subject() string                  { return "t.0" }
func (f fakeMsg) Reply() string                    { return "" }
func (f fakeMsg) Ack() error                       { *f.acks++; return nil }
func (f fakeMsg) DoubleAck(context.Context) error  { *f.acks++; return nil }
func (f fakeMsg) Nak() error                       { return nil }
func (f fakeMsg) NakWithDelay(time.Duration) error { return nil }
func (f fakeMsg) InProgress() error                { return nil }
func (f fakeMsg) Term() error                      { return nil }
func (f fakeMsg) TermWithReason(string) error      { return nil }

// laneReader is a partition's reader of lane, with no consumer: for
// tests that hand it messages themselves (holdFake).
func laneReader(lane string) *reader {
	return &reader{lane: lane, exclusive: true, nacked: map[uint64]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
}

// holdFake has s hold m, pulled by r: the delivery handed on, or nil
// for a copy dropped.
func holdFake(t *testing.T, s *sub, r *reader, m fakeMsg) *held {
	t.Helper()
	h, err := s.hold(r, m)
	if err != nil {
		t.Fatalf("hold %d: %v", m.seq, err)
	}
	return h
}

// TestReclaimedLaneSkipsSettled: a partition's reader holds messages 1
// to 4; 2 is acknowledged while 1 is still unsettled, 4 handled after
// the lease ran out (not acknowledged). The member claims the lane again
// and the reset redelivers from 1: 2 and 4 are acknowledged again and
// not handed on; 1, 3 (never settled) and a message of another ID at 2's
// sequence (a stream created anew) are.
func TestReclaimedLaneSkipsSettled(t *testing.T) {
	s := newSub(nil, "t", &streamRef{name: "T", parts: 1}, driver.SubscribeOptions{})
	newReader := func() *reader { return laneReader("0") }
	acks := 0
	hold := func(r *reader, seq, cseq uint64, id string) *held {
		t.Helper()
		return holdFake(t, s, r, fakeMsg{seq, cseq, id, &acks})
	}
	old := newReader()
	var hs []*held
	for i, id := range []string{"a", "b", "c", "d"} {
		hs = append(hs, hold(old, uint64(i+1), uint64(i+1), id))
	}
	if msgs, _ := s.take([]*driver.Delivery{&hs[1].d}, true); len(msgs) != 1 {
		t.Fatalf("acknowledging 2 took %d messages, want 1", len(msgs))
	}
	old.lost.Store(true)
	if msgs, _ := s.take([]*driver.Delivery{&hs[3].d}, true); len(msgs) != 0 {
		t.Fatalf("acknowledging 4 after the lease ran out took %d messages, want none", len(msgs))
	}

	r := newReader()
	acks = 0
	for _, c := range []struct {
		seq      uint64
		id       string
		handedOn bool
	}{{1, "a", true}, {2, "b", false}, {3, "c", true}, {4, "d", false}, {5, "e", true}} {
		if got := hold(r, c.seq, c.seq, c.id) != nil; got != c.handedOn {
			t.Errorf("redelivery of %d (%s) handed on: %v, want %v", c.seq, c.id, got, c.handedOn)
		}
	}
	if acks != 2 {
		t.Errorf("%d redeliveries acknowledged again, want 2 (of 2 and 4)", acks)
	}
	other := newReader()
	if hold(other, 1, 1, "a") == nil || hold(other, 2, 2, "not b") == nil {
		t.Error("a message of another ID at a sequence acknowledged before was not handed on")
	}
}

// nopKV is a lease bucket whose deletes succeed and do nothing: release
// ends by deleting the lease.
type nopKV struct{ jetstream.KeyValue }

func (nopKV) Delete(context.Context, string, ...jetstream.KVDeleteOpt) error { return nil }

// nopLanes is an engine with nothing in flight: Revoked returns at once.
type nopLanes struct{}

func (nopLanes) Claimed([]string)                  {}
func (nopLanes) Revoked(context.Context, []string) {}
func (nopLanes) Lost([]string)                     {}

// TestReleaseForgetsLane: a member acknowledged messages out of order on
// lanes 0 and 1 (their first message is still unsettled), then gives
// lane 0 up to another member (release). It must forget what it
// remembers of lane 0, and of lane 0 only: should it claim lane 0 again
// later, the lane's other owner meanwhile settled (or handled again) what
// is in between, and a message at a remembered sequence is one this
// member must not take for its own. Without release's forgetting, lane
// 0's entry is left and a redelivery of its message 2 is acknowledged
// instead of handed on.
func TestReleaseForgetsLane(t *testing.T) {
	s := newSub(nil, "t", &streamRef{name: "T", parts: 2}, driver.SubscribeOptions{Lanes: nopLanes{}})
	p := &partitioned{s: s, kv: nopKV{}, ttl: time.Second, ctx: context.Background(), leases: map[int]*lease{}}
	s.part = p
	acks := 0
	readers := map[string]*reader{}
	for part, lane := range []string{"0", "1"} {
		r := laneReader(lane)
		readers[lane] = r
		s.readers[lane] = r
		p.leases[part] = &lease{part: part, lane: lane, reader: r, claimed: true}
		holdFake(t, s, r, fakeMsg{1, 1, lane + "a", &acks}) // unsettled
		h := holdFake(t, s, r, fakeMsg{2, 2, lane + "b", &acks})
		if msgs, _ := s.take([]*driver.Delivery{&h.d}, true); len(msgs) != 1 {
			t.Fatalf("lane %s: acknowledging 2 took %d messages, want 1", lane, len(msgs))
		}
		if !s.settled.settledLocked(lane, 2, lane+"b") {
			t.Fatalf("lane %s: 2, acknowledged while 1 was unsettled, is not remembered", lane)
		}
	}
	close(readers["0"].done) // its pump returned
	p.release(0)
	if ms, ok := s.settled["0"]; ok {
		t.Errorf("after lane 0 was given up, the member still remembers %v of it", ms)
	}
	if !s.settled.settledLocked("1", 2, "1b") {
		t.Error("giving lane 0 up forgot lane 1's acknowledgement too")
	}
	again := laneReader("0") // the reset redelivers from 1
	holdFake(t, s, again, fakeMsg{1, 1, "0a", &acks})
	if holdFake(t, s, again, fakeMsg{2, 2, "0b", &acks}) == nil {
		t.Error("claimed again after it was given up, lane 0's message 2 was acknowledged, not handed on")
	}
}

// TestLowestUnsettled: a partition's reader holds 1 to 4 and hands 1
// back with Nack; while 1 is due again, acknowledging 3 is out of order
// (remembered). 1 comes again, after 4 in pull order but first by
// sequence: acknowledging 2 is still out of order. Once 1 is
// acknowledged, 4 is the lowest unsettled, and acknowledging it is in
// order (the lane forgets 2 and 3 below it). Ack finds each reader's lowest unsettled sequence from the
// reader's own list, kept in sequence order by hold and take; a list
// kept in pull order, or one that forgot the sequences handed back,
// fails here.
func TestLowestUnsettled(t *testing.T) {
	s := newSub(nil, "t", &streamRef{name: "T", parts: 1}, driver.SubscribeOptions{})
	r := laneReader("0")
	acks := 0
	hs := map[uint64]*held{}
	for seq := uint64(1); seq <= 4; seq++ {
		hs[seq] = holdFake(t, s, r, fakeMsg{seq, seq, string(rune('a' + seq - 1)), &acks})
	}
	take := func(seq uint64, ack bool) {
		t.Helper()
		if msgs, _ := s.take([]*driver.Delivery{&hs[seq].d}, ack); len(msgs) != 1 {
			t.Fatalf("taking %d took %d messages, want 1", seq, len(msgs))
		}
	}
	lowest := func(want uint64) {
		t.Helper()
		s.mu.Lock()
		defer s.mu.Unlock()
		if got := r.lowestUnsettledLocked(); got != want {
			t.Fatalf("lowest unsettled %d, want %d", got, want)
		}
	}
	take(1, false)
	lowest(1)
	take(3, true)
	if hs[1] = holdFake(t, s, r, fakeMsg{1, 5, "a", &acks}); hs[1] == nil {
		t.Fatal("1, handed back with Nack, was not held again")
	}
	lowest(1)
	take(2, true)
	take(1, true)
	lowest(4)
	for _, c := range []struct {
		seq  uint64
		id   string
		want bool
	}{{1, "a", false}, {2, "b", true}, {3, "c", true}} {
		if got := s.settled.settledLocked("0", c.seq, c.id); got != c.want {
			t.Errorf("%d remembered as acknowledged out of order: %v, want %v", c.seq, got, c.want)
		}
	}
	take(4, true)
	lowest(0)
	if ms, ok := s.settled["0"]; ok {
		t.Errorf("after 4 was acknowledged in order, %v is still remembered", ms)
	}
	if r.first != nil || r.last != nil {
		t.Errorf("the reader still lists deliveries after all were settled")
	}
}

// BenchmarkAckPartitioned measures Ack's bookkeeping (take) on
// partitioned lanes: a member holds 1024 deliveries over 4 lanes and
// the engine acknowledges them in batches of 16, 32 or 64, oldest first
// but out of order within a batch (keys complete out of order); the
// deliveries of each batch are then held again as the lane's newest (as
// the pump would hold new ones). The server's side (the acks sent, the
// flush) is left out.
func BenchmarkAckPartitioned(b *testing.B) {
	for _, batch := range []int{16, 32, 64} {
		b.Run("batch="+strconv.Itoa(batch), func(b *testing.B) { benchmarkAck(b, batch) })
	}
}

func benchmarkAck(b *testing.B, batch int) {
	const (
		lanes   = 4
		holding = 1024
	)
	s := newSub(nil, "t", &streamRef{name: "T", parts: lanes}, driver.SubscribeOptions{})
	acks := 0
	var top [lanes]uint64
	pulled := make([]*held, 0, holding) // oldest first
	for i := range lanes {
		r := laneReader(strconv.Itoa(i))
		for range holding / lanes {
			top[i]++
			h, err := s.hold(r, fakeMsg{top[i], top[i], "id" + strconv.FormatUint(top[i], 10), &acks})
			if err != nil || h == nil {
				b.Fatalf("hold: %v", err)
			}
			pulled = append(pulled, h)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(pulled), func(i, j int) { pulled[i], pulled[j] = pulled[j], pulled[i] })
	slices.SortStableFunc(pulled, func(x, y *held) int { return cmp.Compare(x.seq, y.seq) }) // lanes interleaved
	ds := make([]*driver.Delivery, batch)
	at := 0 // pulled is a ring: the oldest at at
	b.ReportAllocs()
	for b.Loop() {
		oldest := pulled[at : at+batch]
		for j, h := range oldest {
			ds[j] = &h.d
		}
		rng.Shuffle(batch, func(i, j int) { ds[i], ds[j] = ds[j], ds[i] })
		if msgs, _ := s.take(ds, true); len(msgs) != batch {
			b.Fatalf("took %d messages, want %d", len(msgs), batch)
		}
		s.mu.Lock()
		for _, h := range oldest {
			lane, _ := strconv.Atoi(h.r.lane)
			top[lane]++
			h.seq = top[lane]
			s.held.push(h)
		}
		s.mu.Unlock()
		at = (at + batch) % holding
	}
}

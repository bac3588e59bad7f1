package natsbus

import (
	"context"
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

// TestReclaimedLaneSkipsSettled: a partition's reader holds messages 1
// to 4; 2 is acknowledged while 1 is still unsettled, 4 handled after
// the lease ran out (not acknowledged). The member claims the lane again
// and the reset redelivers from 1: 2 and 4 are acknowledged again and
// not handed on; 1, 3 (never settled) and a message of another ID at 2's
// sequence (a stream created anew) are.
func TestReclaimedLaneSkipsSettled(t *testing.T) {
	s := newSub(nil, "t", &streamRef{name: "T", parts: 1}, driver.SubscribeOptions{})
	newReader := func() *reader {
		return &reader{lane: "0", exclusive: true, nacked: map[uint64]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	}
	acks := 0
	hold := func(r *reader, seq, cseq uint64, id string) *held {
		t.Helper()
		h, err := s.hold(r, fakeMsg{seq, cseq, id, &acks})
		if err != nil {
			t.Fatalf("hold %d: %v", seq, err)
		}
		return h
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

package natsbus

import "testing"

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

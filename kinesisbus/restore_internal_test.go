package kinesisbus

import (
	"testing"
	"time"
)

// TestChooseRestored: leases created again after the lease table was
// deleted (restoredOwner's) are taken only once they expired on the
// taker's clock, from when it first saw them restored, even when the
// counter is the one it saw before the deletion (a lease never taken:
// someone may have taken it since); they count for no member and are
// never asked for. A non-ended lease gone from the scan is a vanished
// one (the table was deleted); an ended one is cleanup's.
func TestChooseRestored(t *testing.T) {
	const failover = 3 * time.Second
	t0 := time.Now()
	s := &sub{
		conn: &conn{cfg: &config{failover: failover}},
		me:   "me",
		held: map[string]*shard{},
		seen: map[string]seenLease{
			"a":    {counter: 7, owner: "other", at: t0.Add(-time.Second)},
			"b":    {counter: 0}, // unowned, never taken, when last seen
			"done": {counter: 9, owner: "other", ended: true, at: t0.Add(-time.Second)},
		},
	}
	restored := []*lease{
		{key: "a", owner: restoredOwner, checkpoint: TrimHorizon},
		{key: "b", owner: restoredOwner, checkpoint: TrimHorizon},
	}
	if !s.vanished(nil) {
		t.Error("vanished(no leases) = false; want true: a and b, not ended, are gone")
	}
	if s.vanished(restored) {
		t.Error("vanished(a and b) = true; want false: only done, ended, is gone (cleanup's)")
	}
	keys := func(ls []*lease) []string {
		var ks []string
		for _, l := range ls {
			ks = append(ks, l.key)
		}
		return ks
	}
	if got := s.choose(restored, t0); len(got) > 0 {
		t.Errorf("choose at once = %v; want none: restored leases expire first", keys(got))
	}
	// Another member holds c and renews it: the restored leases are
	// neither its nor asked for from anyone.
	withOther := append(restored, &lease{key: "c", owner: "x", counter: 4, checkpoint: "123"})
	if got := s.choose(withOther, t0.Add(failover/2)); len(got) > 0 {
		t.Errorf("choose before failover_time, c held by x = %v; want none", keys(got))
	}
	if got := s.choose(withOther, t0.Add(failover+time.Millisecond)); len(got) != 2 || got[0].owner != restoredOwner || got[1].owner != restoredOwner {
		t.Errorf("choose after failover_time = %v; want a and b, the restored leases, expired", keys(got))
	}
}

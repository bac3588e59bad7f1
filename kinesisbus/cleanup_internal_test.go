package kinesisbus

import "testing"

// TestFinished: when the lease of a finished shard may be deleted, as the
// KCL's lease cleanup decides it.
func TestFinished(t *testing.T) {
	leases := func(ls ...*lease) map[string]*lease {
		m := map[string]*lease{}
		for _, l := range ls {
			m[l.key] = l
		}
		return m
	}
	parent := &lease{key: "p", checkpoint: ShardEnd}
	child := func(key, cp string) *lease { return &lease{key: key, checkpoint: cp, parents: []string{"p"}} }
	for _, c := range []struct {
		name     string
		l        *lease
		byKey    map[string]*lease
		listed   bool
		children []string
		want     bool
	}{
		{"children past their start", parent, leases(parent, child("a", "49"), child("b", ShardEnd)), true, []string{"a", "b"}, true},
		{"a child at TRIM_HORIZON", parent, leases(parent, child("a", "49"), child("b", TrimHorizon)), true, []string{"a", "b"}, false},
		{"a child at AT_TIMESTAMP", parent, leases(parent, child("a", AtTimestamp), child("b", "7")), true, []string{"a", "b"}, false},
		{"a child without a lease", parent, leases(parent, child("a", "49")), true, []string{"a", "b"}, false},
		{"no children listed yet", parent, leases(parent), true, nil, false},
		{"its own parent still leased", &lease{key: "p", checkpoint: ShardEnd, parents: []string{"g"}},
			leases(&lease{key: "g", checkpoint: ShardEnd}, child("a", "49")), true, []string{"a"}, false},
		{"gone, children leased at their start", parent, leases(parent, child("a", TrimHorizon)), false, []string{"a"}, true},
		{"gone, a child without a lease", parent, leases(parent), false, []string{"a"}, false},
		{"gone, no children left", parent, leases(parent), false, nil, true},
	} {
		if got := finished(c.l, c.byKey, c.listed, c.children); got != c.want {
			t.Errorf("%s: finished = %v, want %v", c.name, got, c.want)
		}
	}
}

package driver_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

func TestBackoff(t *testing.T) {
	for _, tt := range []struct {
		attempt int
		lo, hi  time.Duration
	}{
		{1, 50 * time.Millisecond, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, 200 * time.Millisecond},
		{4, 400 * time.Millisecond, 800 * time.Millisecond},
		{10, 500 * time.Millisecond, time.Second}, // capped
	} {
		for range 100 {
			if d := driver.Backoff(tt.attempt, 100*time.Millisecond, time.Second); d < tt.lo || d > tt.hi {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", tt.attempt, d, tt.lo, tt.hi)
			}
		}
	}
}

// Partition is FNV-1a modulo n: stable across releases, since partitioned
// topics already hold data placed by it.
func TestPartition(t *testing.T) {
	for key, want := range map[string]int{"customer-7": 1, "": 1, "k": 2} { // FNV-1a offset basis and prime, computed apart
		if got := driver.Partition(key, 4); got != want {
			t.Errorf("Partition(%q, 4) = %d, want %d", key, got, want)
		}
	}
}

type closer struct{ closed *atomic.Int32 }

func (c *closer) Close() error { c.closed.Add(1); return errors.New("ignored") }

func TestSubscribers(t *testing.T) {
	var n atomic.Int32
	var subs driver.Subscribers[*closer]
	a, b := &closer{&n}, &closer{&n}
	if !subs.Add(a) || !subs.Add(b) {
		t.Fatal("Add on an open set failed")
	}
	subs.Remove(b)
	if subs.Closed() {
		t.Fatal("Closed before Close")
	}
	if !subs.Close() {
		t.Fatal("first Close reported false")
	}
	if n.Load() != 1 {
		t.Errorf("Close closed %d subscribers, want the 1 still open", n.Load())
	}
	if subs.Close() || subs.Add(a) || !subs.Closed() {
		t.Error("after Close: a second Close or an Add succeeded, or Closed is false")
	}
}

func TestBalance(t *testing.T) {
	mine := func(lanes ...int) []bool {
		m := make([]bool, 6)
		for _, l := range lanes {
			m[l] = true
		}
		return m
	}
	for _, tt := range []struct {
		name    string
		members []string
		owners  []string
		mine    []bool
		claims  int
		release int
		again   bool
	}{
		{"alone takes all", nil, []string{"", "", "", "", "", ""}, mine(), 6, -1, false},
		{"two: up to three", []string{"b"}, []string{"", "", "", "", "", ""}, mine(), 3, -1, false},
		{"above ceil gives one up at once", []string{"b", "c"}, []string{"a", "a", "a", "b", "", ""}, mine(0, 1, 2), 0, 2, true},
		{"a needy member: only up to floor", []string{"b", "c"}, []string{"a", "", "b", "b", "", ""}, mine(0), 1, -1, false},
		{"none free, one needy: the most loaded gives", []string{"b", "c", "d"}, []string{"a", "a", "b", "b", "c", "c"}, mine(0, 1), 0, 1, false},
		{"none free, one needy, at floor: another gives", []string{"b", "c", "d"}, []string{"a", "b", "b", "c", "c", "b"}, mine(0), 0, -1, false},
		{"own lane not yet released is not free", nil, []string{"a", "", "", "", "", ""}, mine(), 5, -1, false},
	} {
		claim, release, again := driver.Balance("a", tt.members, tt.owners, tt.mine)
		if len(claim) != tt.claims || release != tt.release || again != tt.again {
			t.Errorf("%s: claim %v release %d again %v; want %d claims, release %d, again %v",
				tt.name, claim, release, again, tt.claims, tt.release, tt.again)
		}
		for _, l := range claim {
			if tt.owners[l] != "" {
				t.Errorf("%s: claims lane %d, owned by %q", tt.name, l, tt.owners[l])
			}
		}
	}
}

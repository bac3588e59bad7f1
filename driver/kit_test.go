package driver_test

import (
	"bytes"
	"context"
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

// TestWatch checks that Watch checks at once, when a wake-up comes, and
// when the time its check returned comes, and ends with its context.
func TestWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	wake := make(chan struct{}, 1)
	checks := make(chan time.Time, 10)
	var next atomic.Int64 // how long after a check the next is due
	next.Store(int64(time.Hour))
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		driver.Watch(ctx, wake, func(now time.Time) time.Time {
			checks <- now
			return now.Add(time.Duration(next.Load()))
		})
	}()
	wait := func(why string) {
		t.Helper()
		select {
		case <-checks:
		case <-time.After(5 * time.Second):
			t.Fatalf("no check %s", why)
		}
	}
	wait("at the start")
	driver.Notify(wake)
	wait("after a wake-up")
	next.Store(int64(20 * time.Millisecond))
	driver.Notify(wake)
	wait("after a second wake-up")
	wait("when the time it returned came") // an hour would fail the test
	cancel()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not end with its context")
	}
}

func TestShift(t *testing.T) {
	a, b, c := new(int), new(int), new(int)
	buf := []*int{a, b, c}
	whole := buf
	out := driver.Shift(&buf, 2)
	if len(out) != 2 || out[0] != a || out[1] != b || len(buf) != 1 || buf[0] != c {
		t.Fatalf("Shift(2) = %v, buffer %v", out, buf)
	}
	if whole[0] != nil || whole[1] != nil {
		t.Fatal("the buffer's array keeps what was taken")
	}
	out[0] = nil // the hand-out is its own
	if whole[2] != c {
		t.Fatal("the hand-out shares the buffer's array")
	}
	if out := driver.Shift(&buf, 1); len(out) != 1 || out[0] != c || buf != nil {
		t.Fatalf("the last Shift = %v, buffer %v; want [c] and no array", out, buf)
	}
}

func TestCopyBodies(t *testing.T) {
	msgs := []*driver.Message{{Body: []byte("one")}, {}, {Body: []byte{}}, {Body: []byte("three")}}
	got := driver.CopyBodies(msgs)
	for _, m := range msgs {
		for i := range m.Body {
			m.Body[i] = 'x'
		}
	}
	want := [][]byte{[]byte("one"), nil, {}, []byte("three")}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) || (got[i] == nil) != (want[i] == nil) {
			t.Errorf("body %d: got %q (nil %t), want %q (nil %t)", i, got[i], got[i] == nil, want[i], want[i] == nil)
		}
	}
	if got[0] = append(got[0], '!'); string(got[3]) != "three" {
		t.Errorf("appending to one copy wrote over the next: %q", got[3])
	}
}

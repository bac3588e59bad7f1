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

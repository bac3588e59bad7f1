package transporttest

// The fault tests' ledger: every message handled, by any consumer (in
// this process, or a child process through its output), counted by ID,
// with the order check a fault allows. ledger.mu guards it; handlers and
// the goroutines reading children's output call it.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// ledger counts what the consumers of a fault test handled.
//
// Order, across faults, is what at-least-once delivery can keep: a
// message may come again (its consumer died before it was settled, or a
// lane moved), but no message is handled for the first time after a newer
// message of its key was: nothing is skipped and picked up later. A
// message handled again after a newer one of its key is a replay,
// counted with the duplicates.
type ledger struct {
	mu      sync.Mutex
	seen    map[string]int
	newest  map[string]int64 // per key: the newest sequence handled
	bad     []string         // the first few order violations
	badN    int
	replays int
	poison  []int // the attempts a poisoned message was handled with
	by      map[string]int
}

func newLedger() *ledger {
	return &ledger{seen: map[string]int{}, newest: map[string]int64{}, by: map[string]int{}}
}

// add records that who handled the message id of key with sequence seq
// (0: none).
func (l *ledger) add(id, key string, seq int64, _ int, who string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen[id]++
	l.by[who]++
	if key == "" || seq == 0 {
		return
	}
	newest, ok := l.newest[key]
	switch {
	case !ok || seq > newest:
		l.newest[key] = seq
	case l.seen[id] > 1:
		l.replays++
	case seq < newest:
		l.badN++
		if len(l.bad) < 5 {
			l.bad = append(l.bad, fmt.Sprintf("key %q: message %d handled for the first time after %d", key, seq, newest))
		}
	}
}

// handler records what an in-process consumer handles.
func (l *ledger) handler(who string) omnibus.Handler {
	return func(_ context.Context, m *omnibus.Message) error {
		seq, _ := strconv.ParseInt(m.Headers[headerSeq], 10, 64)
		l.add(m.ID, m.Key, seq, m.Attempt, who)
		return nil
	}
}

func (l *ledger) poisoned(_ string, attempt int) {
	l.mu.Lock()
	l.poison = append(l.poison, attempt)
	l.mu.Unlock()
}

// poisonAttempts are the attempts a poisoned message's handler saw.
func (l *ledger) poisonAttempts() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.poison)
}

func (l *ledger) unique() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// missing lists the IDs of want not handled.
func (l *ledger) missing(want []string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var miss []string
	for _, id := range want {
		if l.seen[id] == 0 {
			miss = append(miss, id)
		}
	}
	return miss
}

// await waits up to d until every one of want was handled.
func (l *ledger) await(t *testing.T, d time.Duration, want []string) {
	t.Helper()
	Eventually(t, d, func() bool { return len(l.missing(want)) == 0 }, func() string {
		miss := l.missing(want)
		return fmt.Sprintf("%d of %d messages never handled (lost), e.g. %v", len(miss), len(want), miss[:min(5, len(miss))])
	})
}

// check fails t when a message was handled for the first time after a
// newer one of its key and ordered says the transport keeps key order,
// and logs the fault's numbers.
func (l *ledger) check(t *testing.T, fault string, ordered bool, published int, extra string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if ordered && l.badN > 0 {
		t.Errorf("%s: key order broken %d times, e.g.:\n\t%s", fault, l.badN, strings.Join(l.bad, "\n\t"))
	}
	dups := 0
	for _, c := range l.seen {
		dups += c - 1
	}
	order := "not checked (unordered lanes)"
	if ordered {
		order = "kept"
	}
	t.Logf("FAULT %s: %d published, %d handled, 0 lost, %d duplicates (%d replays after a newer message of the key), key order %s%s",
		fault, published, len(l.seen), dups, l.replays, order, extra)
}

package transporttest

// Checks: the collector, which counts unique IDs and checks key and
// lane order as handlers settle (handlers call it from the consumer's
// workers; collector.mu guards it), publishing numbered messages, calls
// bounded in time (within), and the goroutines a test started (stacks,
// leakCheck).

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omnibus-go/omnibus"
)

// headerSeq carries the number publishN gives each message.
const headerSeq = "seq"

// seqs numbers the messages publishN sends, in the order it publishes
// them, across all topics: a key's messages, and a lane's, carry
// increasing numbers.
var seqs atomic.Int64

// collector records what handlers settled and checks order as it goes.
//
// A handler calls add just before it returns nil, so add sees each key's
// settlements in the order they happen. Order means: no message of a key
// (of a lane, where the test asks for lane order) is handled after a
// newer one of it was settled, redeliveries included. The same message
// again, after it was settled and before anything newer of its key was,
// is a duplicate: at least once allows it where the test says so.
//
// A message its publisher sent again after an unknown outcome, on a
// transport that stores it twice then (Harness.ResendsStoredTwice), may
// come again in any test: its copy lands behind what was published
// since, so it is neither a duplicate nor a break of order that fails
// the test (check decides, once the resends are known).
type collector struct {
	mu    sync.Mutex
	began time.Time
	ids   map[string]int
	msgs  map[string]*omnibus.Message
	// places is where and when each delivery of a message was: what a
	// duplicate's report names.
	places map[string][]place
	key    orderLog
	lane   orderLog
}

// place is one delivery of a message: its lane, position and attempt,
// and when it settled, since the collector began.
type place struct {
	lane, position string
	attempt        int
	at             time.Duration
}

func (p place) String() string {
	return fmt.Sprintf("lane %q position %q attempt %d at %v", p.lane, p.position, p.attempt, p.at.Round(time.Millisecond))
}

// orderLog is the newest sequence settled per key (or lane) and the
// violations seen.
type orderLog struct {
	newest map[string]int64
	bad    []violation
}

// violation is a message settled after a newer one of its key or lane:
// the delivery times of message id.
type violation struct {
	id    string
	times int
	text  string
}

func (o *orderLog) add(kind, name, id string, seq int64, times int) {
	last, seen := o.newest[name]
	if !seen || seq >= last {
		o.newest[name] = seq
		return
	}
	again := ""
	if times > 1 {
		again = fmt.Sprintf(" (delivery %d of it)", times)
	}
	o.bad = append(o.bad, violation{id, times, fmt.Sprintf("%s %q: message %d settled after %d%s", kind, name, seq, last, again)})
}

func newCollector() *collector {
	return &collector{
		began: time.Now(), ids: map[string]int{}, msgs: map[string]*omnibus.Message{}, places: map[string][]place{},
		key: orderLog{newest: map[string]int64{}}, lane: orderLog{newest: map[string]int64{}},
	}
}

func (c *collector) add(m *omnibus.Message) {
	seq, err := strconv.ParseInt(m.Headers[headerSeq], 10, 64)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ids[m.ID]++
	times := c.ids[m.ID]
	cp := *m
	cp.Body = bytes.Clone(m.Body)
	cp.Headers = maps.Clone(m.Headers)
	c.msgs[m.ID] = &cp
	c.places[m.ID] = append(c.places[m.ID], place{m.Lane, m.Position, m.Attempt, time.Since(c.began)})
	if err != nil {
		return // not from publishN: no order to check
	}
	if m.Key != "" {
		c.key.add("key", m.Key, m.ID, seq, times)
	}
	c.lane.add("lane", m.Lane, m.ID, seq, times)
}

func (c *collector) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

func (c *collector) handler(ctx context.Context, m *omnibus.Message) error {
	c.add(m)
	return nil
}

// await waits until every one of ids has been handled, and fails naming
// how many were not.
func (c *collector) await(t *testing.T, ids []string) {
	t.Helper()
	c.awaitWithin(t, timeout, ids)
}

// awaitWithin is await with a bound of d.
func (c *collector) awaitWithin(t *testing.T, d time.Duration, ids []string) {
	t.Helper()
	Eventually(t, d, func() bool { return len(c.missing(ids)) == 0 }, func() string {
		miss := c.missing(ids)
		return fmt.Sprintf("%d of %d messages never handled, e.g. %v", len(miss), len(ids), miss[:min(5, len(miss))])
	})
}

// missing lists the wanted IDs not seen.
func (c *collector) missing(want []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var miss []string
	for _, id := range want {
		if c.ids[id] == 0 {
			miss = append(miss, id)
		}
	}
	return miss
}

// ordering is the order a test asserts.
type ordering int

const (
	anyOrder  ordering = iota
	keyOrder           // per key
	laneOrder          // per lane, and so per key
)

// orderOf is the order a consumer with the default ordering keeps on c's
// transport: key order where lanes are ordered.
func orderOf(c *omnibus.Client) ordering {
	if c.Capabilities().Ordered {
		return keyOrder
	}
	return anyOrder
}

// check fails t when the order the test asks for was broken, and when
// messages were handled more than once in a test that allows no
// duplicates; allowed duplicates are counted in the log. The copies of
// messages published again that the transport stores twice (see
// collector) are counted apart, in the log.
func (c *collector) check(t *testing.T, ord ordering, dupsAllowed bool) {
	t.Helper()
	failures, notes := c.verdict(storesResendsTwice(t), resends, ord, dupsAllowed)
	for _, f := range failures {
		t.Error(f)
	}
	for _, n := range notes {
		t.Log(n)
	}
}

// verdict is check's findings: what fails the test, and what is worth
// its log. twice says whether the transport stores a message published
// again twice; resends(id) is how many times message id was.
func (c *collector) verdict(twice bool, resends func(id string) int, ord ordering, dupsAllowed bool) (failures, notes []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// copies is how many deliveries of message id after its first may
	// be copies: one per time it was published again.
	copies := func(id string) int {
		if !twice {
			return 0
		}
		return resends(id)
	}
	report := func(what string, o *orderLog) {
		var bad []string
		for _, v := range o.bad {
			if v.times > 1 && v.times <= 1+copies(v.id) {
				continue // a copy, behind what was published since
			}
			bad = append(bad, v.text)
		}
		if len(bad) > 0 {
			failures = append(failures, fmt.Sprintf("%s order broken %d times (no message may be handled after a newer one of its %s was settled), e.g.:\n\t%s",
				what, len(bad), what, strings.Join(bad[:min(5, len(bad))], "\n\t")))
		}
	}
	if ord >= keyOrder {
		report("key", &c.key)
	}
	if ord >= laneOrder {
		report("lane", &c.lane)
	}
	dups, copied := 0, 0
	var dupIDs []string
	for id, n := range c.ids {
		if n > 1 {
			k := min(n-1, copies(id))
			copied += k
			dups += n - 1 - k
			if n-1-k > 0 {
				dupIDs = append(dupIDs, id)
			}
		}
	}
	switch {
	case dups > 0 && !dupsAllowed:
		failures = append(failures, fmt.Sprintf("%d duplicate deliveries of %d messages; this test allows none, e.g.:%s", dups, len(c.ids), c.duplicates(dupIDs)))
	case dups > 0:
		notes = append(notes, fmt.Sprintf("%d duplicate deliveries of %d messages (allowed here), e.g.:%s", dups, len(c.ids), c.duplicates(dupIDs)))
	}
	if copied > 0 {
		notes = append(notes, fmt.Sprintf("%d deliveries of copies of messages published again after an unknown outcome, which the transport stores twice (Harness.ResendsStoredTwice)", copied))
	}
	return failures, notes
}

// duplicates describes the first few of ids, messages handled more than
// once, in the order they were first handled: each delivery's lane,
// position, attempt and time. c.mu is held.
func (c *collector) duplicates(ids []string) string {
	slices.SortFunc(ids, func(a, b string) int { return cmp.Compare(c.places[a][0].at, c.places[b][0].at) })
	var b strings.Builder
	for _, id := range ids[:min(5, len(ids))] {
		fmt.Fprintf(&b, "\n\t%q (key %q) handled %d times:", id, c.msgs[id].Key, c.ids[id])
		for _, p := range c.places[id] {
			fmt.Fprintf(&b, "\n\t\t%v", p)
		}
	}
	return b.String()
}

// publishN publishes n messages with keys key0..key{keys-1} (no key when
// keys is 0) and a seq header numbering them, in batches; it returns the
// IDs in order.
func publishN(t *testing.T, c *omnibus.Client, topic string, n, keys, size int) []string {
	t.Helper()
	return publishKeys(t, c, topic, n, size, func(i int) string {
		if keys == 0 {
			return ""
		}
		return "key" + strconv.Itoa(i%keys)
	})
}

// publishKeys publishes n messages, message i with key keyOf(i), and
// returns their IDs in order.
func publishKeys(t *testing.T, c *omnibus.Client, topic string, n, size int, keyOf func(i int) string) []string {
	t.Helper()
	ctx := ctxT(t)
	ids := make([]string, 0, n)
	const batch = 100
	for i := 0; i < n; i += batch {
		var ms []*omnibus.Message
		for j := i; j < min(n, i+batch); j++ {
			ms = append(ms, &omnibus.Message{
				Key:     keyOf(j),
				Type:    "test.event",
				Headers: map[string]string{headerSeq: strconv.FormatInt(seqs.Add(1), 10)},
				Body:    bytes.Repeat([]byte{'x'}, size),
			})
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// within runs fn and waits up to d for it to return. When fn is still
// running after d, within fails t with the stacks of the goroutines t's
// test started and returns false, leaving fn running: a deadlock cannot
// be undone from outside.
func within(t testing.TB, d time.Duration, what string, fn func()) bool {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		t.Errorf("%s did not return within %v; goroutines:\n%s", what, d, stacks(t))
		return false
	}
}

// firstGoroutine holds, per test and subtest marked, the lowest number a
// goroutine started after it began can have, so that a test's stacks
// leave out most of what earlier tests left behind. Numbers grow, but
// each P hands them out from a batch of its own (16 in Go's runtime).
var firstGoroutine sync.Map // test name -> int64

// markGoroutines records where t's goroutines start.
func markGoroutines(t *testing.T) {
	var last int64
	for _, g := range goroutines() {
		last = max(last, g.id)
	}
	firstGoroutine.Store(t.Name(), last+1-16*int64(runtime.GOMAXPROCS(0)))
}

type goroutine struct {
	id    int64
	stack string
}

func goroutines() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		var id int64
		if _, err := fmt.Sscanf(g, "goroutine %d ", &id); err == nil {
			gs = append(gs, goroutine{id, g})
		}
	}
	return gs
}

// stacks returns the stacks of the goroutines running omnibus's code
// that t's test started.
func stacks(t testing.TB) string {
	var first int64
	longest := -1
	firstGoroutine.Range(func(name, id any) bool {
		if n := name.(string); len(n) > longest && (t.Name() == n || strings.HasPrefix(t.Name(), n+"/")) {
			first, longest = id.(int64), len(n)
		}
		return true
	})
	var out strings.Builder
	for _, g := range goroutines() {
		if g.id >= first && strings.Contains(g.stack, "omnibus-go/omnibus") && !strings.Contains(g.stack, "transporttest.goroutines") {
			out.WriteString(g.stack)
			out.WriteString("\n\n")
		}
	}
	const most = 32 << 10
	if out.Len() > most {
		return out.String()[:most] + "\n... (cut)"
	}
	return out.String()
}

// leakCheck notes the goroutines running now; the function it returns
// fails t when goroutines started since are still running once they had
// a few seconds to end. Goroutines of the transport's client libraries
// that outlive Close by design are not ours; anything started by the
// test is.
func leakCheck(t *testing.T) func() {
	opts := []goleak.Option{goleak.IgnoreCurrent()}
	return func() {
		t.Helper()
		var err error
		for range 50 { // goroutines may take a moment to unwind
			if err = goleak.Find(opts...); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("goroutines leaked: %v", err)
	}
}

package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Run runs every conformance test against the transport h opens.
func Run(t *testing.T, h Harness) {
	if h.Open == nil {
		t.Fatal("transporttest: Harness.Open is nil")
	}
	if h.Lanes == 0 {
		h.Lanes = 4
	}
	s := &suite{h: h}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"RoundTrip", s.testRoundTrip},
		{"Bodies", s.testBodies},
		{"PublishErrors", s.testPublishErrors},
		{"OrderPerLane", s.testOrderPerLane},
		{"OrderPerKey", s.testOrderPerKey},
		{"GroupSplitsAndTakesOver", s.testGroupTakeover},
		{"EveryGroupGetsEveryMessage", s.testGroups},
		{"Replay", s.testReplay},
		{"Retry", s.testRetry},
		{"DeadLetter", s.testDeadLetter},
		{"DeadLetterNamedTopic", s.testDeadLetterNamed},
		{"Lag", s.testLag},
		{"ShutdownCommits", s.testShutdownCommits},
		{"ContextCancellation", s.testCancel},
		{"Close", s.testClose},
		{"SlowHandler", s.testSlowHandler},
		{"GroupDeleted", s.testGroupDeleted},
		{"DeadLetterRejected", s.testDeadLetterRejected},
		{"ObserverCallsBack", s.testObserverCallsBack},
		{"HandlerIgnoresContext", s.testHandlerIgnoresContext},
		{"RetryingKeyDoesNotStall", s.testRetryingKey},
		{"RevocationKeepsOtherLanes", s.testRevocationKeepsOtherLanes},
		{"HandlerCallsBack", s.testHandlerCallsBack},
		{"MaxInFlightBytes", s.testMaxInFlightBytes},
		{"ShutdownReportsFailedCommit", s.testShutdownReportsFailedCommit},
		{"Reconnect", s.testReconnect},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			markGoroutines(t)
			tt.fn(t)
		})
	}
}

type suite struct {
	h Harness
}

const timeout = 60 * time.Second

// cleanupWait bounds each Close at a test's end: one that hangs fails
// the test with the goroutines' stacks, and the suite goes on.
const cleanupWait = 20 * time.Second

func (s *suite) open(t *testing.T) *omnibus.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := s.h.Open(ctx, t)
	t.Cleanup(func() { within(t, cleanupWait, "Client.Close", func() { _ = c.Close() }) })
	return c
}

var unsafe = regexp.MustCompile(`[^a-z0-9]+`)

// topicPrefix starts every topic the suite creates in this process.
var topicPrefix = fmt.Sprintf("omnibus-%06x-", rand.Uint32()&0xffffff)

// TopicPrefix starts the name of every topic the suite creates in this
// process, and so of what a transport names after a topic. A harness on
// a server other runs share deletes at the end what starts with it, and
// nothing of theirs.
func TopicPrefix() string { return topicPrefix }

// topic returns a fresh topic named after the test, created with the
// harness's lane count.
func (s *suite) topic(t *testing.T, c *omnibus.Client) string {
	t.Helper()
	name := strings.Trim(unsafe.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	name = fmt.Sprintf("%s%s-%x", topicPrefix, name, rand.Uint32())
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.CreateTopic(ctx, name, s.h.Lanes); err != nil {
		t.Fatalf("CreateTopic(%q, %d): %v", name, s.h.Lanes, err)
	}
	return name
}

// need skips t, naming the capability, when have is false.
func need(t *testing.T, have bool, capability string) {
	t.Helper()
	if !have {
		t.Skipf("SKIP (capability %s): the transport does not declare it", capability)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond every 20ms until it holds or d passes, then
// fails t with msg's text. Transport tests use it for every wait.
func Eventually(t testing.TB, d time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	if !poll(d, cond) {
		t.Fatalf("after %v: %s", d, msg())
	}
}

// poll reports whether cond holds within d, polling every 20ms.
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// run starts k.Run and stops it at cleanup; it returns a stop function
// that shuts down gracefully. Run must then return nil: a drain that
// leaves messages unsettled fails the test.
func run(t *testing.T, k *omnibus.Consumer) (stop func()) {
	t.Helper()
	return runUntil(t, k, false)
}

// runStuck is run for a test that leaves a message unsettled on purpose:
// the drain may end with an *UnsettledError.
func runStuck(t *testing.T, k *omnibus.Consumer) (stop func()) {
	t.Helper()
	return runUntil(t, k, true)
}

func runUntil(t *testing.T, k *omnibus.Consumer, stuck bool) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				var ue *omnibus.UnsettledError
				if err != nil && !(stuck && errors.As(err, &ue)) {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(timeout):
				t.Errorf("Run did not return within %v of cancellation; goroutines:\n%s", timeout, stacks(t))
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (s *suite) subscribe(t *testing.T, c *omnibus.Client, topic string, h omnibus.Handler, opts ...omnibus.SubscribeOption) *omnibus.Consumer {
	t.Helper()
	k, err := c.Subscribe(ctxT(t), topic, h, opts...)
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", topic, err)
	}
	t.Cleanup(func() { within(t, cleanupWait, "Consumer.Close", func() { _ = k.Close() }) })
	return k
}

// earliest returns StartFrom(StartEarliest) where the transport can replay;
// elsewhere the group must exist before messages are published, which the
// tests arrange by subscribing first.
func earliest(c *omnibus.Client) []omnibus.SubscribeOption {
	if c.Capabilities().Replay {
		return []omnibus.SubscribeOption{omnibus.StartFrom(omnibus.StartEarliest)}
	}
	return nil
}

func (s *suite) testRoundTrip(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Group("rt"))...)
	stop := run(t, k)
	when := time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC)
	want := &omnibus.Message{
		ID:      "id-" + strconv.FormatUint(rand.Uint64(), 36),
		Key:     "customer-42",
		Type:    "order.created",
		Source:  "/omnibus/test",
		Time:    when,
		Headers: map[string]string{"a": "1", "trace-id": "abc def", "unicode": "é✓"},
		Body:    []byte(`{"order":1}`),
	}
	want.ContentType = "application/json"
	if err := pub.Publish(ctxT(t), topic, want); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	Eventually(t, timeout, func() bool { return col.unique() == 1 }, func() string { return "message not received" })
	stop()
	got := col.msgs[want.ID]
	if got == nil {
		t.Fatalf("received IDs %v, want %q", slices.Collect(maps.Keys(col.ids)), want.ID)
	}
	if got.Key != want.Key || got.Type != want.Type || got.Source != want.Source || !bytes.Equal(got.Body, want.Body) {
		t.Errorf("got key=%q type=%q source=%q body=%q\nwant key=%q type=%q source=%q body=%q",
			got.Key, got.Type, got.Source, got.Body, want.Key, want.Type, want.Source, want.Body)
	}
	if !got.Time.Equal(want.Time) {
		t.Errorf("time: got %v, want %v", got.Time, want.Time)
	}
	if got.ContentType != want.ContentType {
		t.Errorf("content type: got %q, want %q", got.ContentType, want.ContentType)
	}
	for k, v := range want.Headers {
		if got.Headers[k] != v {
			t.Errorf("header %q: got %q, want %q (all: %v)", k, got.Headers[k], v, got.Headers)
		}
	}
	if got.Topic != topic || got.Lane == "" || got.Attempt != 1 {
		t.Errorf("delivery fields: topic=%q lane=%q attempt=%d; want topic %q, a lane, attempt 1", got.Topic, got.Lane, got.Attempt, topic)
	}
}

func (s *suite) testBodies(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	bodies := map[string][]byte{
		"empty":    {},
		"binary":   {0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28, 0x00},
		"oneKiB":   bytes.Repeat([]byte("ab"), 512),
		"unicode":  []byte("zażółć gęślą jaźń ✓"),
		"oneMiB":   nil,
		"trailing": []byte("line\n\r\n\x00"),
	}
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if max := pub.Capabilities().MaxMessageBytes; max == 0 || max >= len(big)+4096 {
		bodies["oneMiB"] = big
	} else {
		delete(bodies, "oneMiB")
		t.Logf("SKIP 1 MiB body (capability MaxMessageBytes = %d)", max)
	}
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, earliest(sub)...)
	stop := run(t, k)
	ids := map[string]string{}
	for name, b := range bodies {
		m := &omnibus.Message{Body: b}
		if err := pub.Publish(ctxT(t), topic, m); err != nil {
			t.Fatalf("Publish %s body: %v", name, err)
		}
		ids[name] = m.ID
	}
	Eventually(t, timeout, func() bool { return col.unique() == len(bodies) }, func() string {
		return fmt.Sprintf("received %d of %d bodies", col.unique(), len(bodies))
	})
	stop()
	for name, id := range ids {
		if got := col.msgs[id].Body; !bytes.Equal(got, bodies[name]) {
			t.Errorf("%s body: got %d bytes %.32q, want %d bytes %.32q", name, len(got), got, len(bodies[name]), bodies[name])
		}
	}
}

func (s *suite) testPublishErrors(t *testing.T) {
	c := s.open(t)
	topic := s.topic(t, c)
	max := c.Capabilities().MaxMessageBytes
	if max == 0 {
		t.Skip("SKIP (capability MaxMessageBytes): the transport declares no size limit")
	}
	ms := []*omnibus.Message{{Body: []byte("ok1")}, {Body: make([]byte, max+1)}, {Body: []byte("ok2")}}
	err := c.Publish(ctxT(t), topic, ms...)
	var pe *omnibus.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish with an oversized message: got %v, want a *PublishError", err)
	}
	if len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(err, omnibus.ErrTooLarge) {
		t.Fatalf("failures %+v, want only index 1 failing with ErrTooLarge", pe.Failed)
	}
}

func (s *suite) testOrderPerLane(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().Ordered, "Ordered")
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Order(omnibus.OrderLane), omnibus.MaxInFlight(64))...)
	stop := run(t, k)
	col.await(t, publishN(t, pub, topic, 2000, 20, 16))
	stop()
	col.check(t, laneOrder, false)
}

func (s *suite) testOrderPerKey(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().Ordered, "Ordered")
	topic := s.topic(t, pub)
	col := newCollector()
	var running, peak atomic.Int64
	h := func(ctx context.Context, m *omnibus.Message) error {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		col.add(m)
		running.Add(-1)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Order(omnibus.OrderKey), omnibus.MaxInFlight(128))...)
	stop := run(t, k)
	const keys = 50
	col.await(t, publishN(t, pub, topic, 3000, keys, 16))
	stop()
	col.check(t, keyOrder, false)
	if peak.Load() <= int64(s.h.Lanes) {
		t.Errorf("key mode ran at most %d handlers at once with %d lanes and %d keys; want more than the lane count", peak.Load(), s.h.Lanes, keys)
	}
}

func (s *suite) testGroupTakeover(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	h := func(ctx context.Context, m *omnibus.Message) error {
		time.Sleep(200 * time.Microsecond)
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Group("takeover"), omnibus.Members(2), omnibus.DrainTimeout(10*time.Second))...)
	stop := run(t, k)
	const n = 4000
	ids := publishN(t, pub, topic, n/2, 40, 32)
	if pub.Capabilities().ExclusiveLanes {
		// Both members hold lanes. Messages keep coming while we wait: on
		// some transports a member learns it holds a lane from its first
		// delivery.
		split := func() bool {
			members := map[int]bool{}
			for _, l := range k.Stats().Lanes {
				if l.Member >= 0 {
					members[l.Member] = true
				}
			}
			return len(members) == 2
		}
		for deadline := time.Now().Add(timeout); !split(); {
			if time.Now().After(deadline) {
				t.Fatalf("after %v: lanes not split over 2 members: %+v", timeout, k.Stats().Lanes)
			}
			ids = append(ids, publishN(t, pub, topic, 40, 40, 32)...)
			time.Sleep(100 * time.Millisecond)
		}
	}
	Eventually(t, timeout, func() bool { return col.unique() > n/8 }, func() string { return "no progress" })
	// One member leaves mid-stream; the other takes its lanes over.
	if err := k.Scale(ctxT(t), 1); err != nil {
		t.Fatalf("Scale(1): %v", err)
	}
	ids = append(ids, publishN(t, pub, topic, n/2, 40, 32)...)
	col.await(t, ids)
	stop()
	// Lanes changed hands gracefully (drained and committed first): not
	// one message may come back.
	col.check(t, orderOf(pub), false)
}

func (s *suite) testGroups(t *testing.T) {
	pub := s.open(t)
	need(t, pub.Capabilities().Groups, "Groups")
	topic := s.topic(t, pub)
	cols := []*collector{newCollector(), newCollector()}
	for i, col := range cols {
		k := s.subscribe(t, s.open(t), topic, col.handler, append(earliest(pub), omnibus.Group(fmt.Sprintf("g%d", i)))...)
		run(t, k)
	}
	ids := publishN(t, pub, topic, 500, 10, 8)
	for _, col := range cols {
		col.await(t, ids)
		col.check(t, orderOf(pub), false)
	}
}

func (s *suite) testReplay(t *testing.T) {
	pub := s.open(t)
	need(t, pub.Capabilities().Replay, "Replay")
	topic := s.topic(t, pub)
	ids := publishN(t, pub, topic, 300, 5, 8)
	// A group created after the messages, asking for the earliest.
	col := newCollector()
	k := s.subscribe(t, s.open(t), topic, col.handler, omnibus.Group("late"), omnibus.StartFrom(omnibus.StartEarliest))
	run(t, k)
	col.await(t, ids)
	// A new group asking for the latest sees only what comes after it.
	late := newCollector()
	k2 := s.subscribe(t, s.open(t), topic, late.handler, omnibus.Group("latest"), omnibus.StartFrom(omnibus.StartLatest))
	run(t, k2)
	time.Sleep(500 * time.Millisecond) // let the group join before publishing
	more := publishN(t, pub, topic, 10, 5, 8)
	Eventually(t, timeout, func() bool { return late.unique() >= 10 }, func() string {
		return fmt.Sprintf("latest group received %d of 10", late.unique())
	})
	if miss := late.missing(more); len(miss) > 0 {
		t.Fatalf("latest group lost %d", len(miss))
	}
	if got := late.unique(); got != 10 {
		t.Errorf("a group starting at the latest received %d messages, want the 10 published after it", got)
	}
	col.check(t, orderOf(pub), false)
	late.check(t, orderOf(pub), false)
}

func (s *suite) testRetry(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	var mu sync.Mutex
	attempts := map[string][]int{}
	h := func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		attempts[m.ID] = append(attempts[m.ID], m.Attempt)
		mu.Unlock()
		if m.Attempt < 3 {
			if m.Attempt == 2 {
				panic("injected panic")
			}
			return errors.New("injected failure")
		}
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.MaxAttempts(5), omnibus.Backoff(10*time.Millisecond, 50*time.Millisecond))...)
	run(t, k)
	ids := publishN(t, pub, topic, 50, 5, 8)
	col.await(t, ids)
	col.check(t, orderOf(pub), false)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if a := attempts[id]; len(a) < 3 || a[0] != 1 || a[1] != 2 || a[2] != 3 {
			t.Fatalf("message %s attempts %v, want 1, 2, 3", id, a)
		}
	}
}

func (s *suite) testDeadLetter(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	dlq := topic + ".dlq"
	if err := pub.CreateTopic(ctxT(t), dlq, 1); err != nil {
		t.Fatalf("CreateTopic(%q): %v", dlq, err)
	}
	dead := newCollector()
	kd := s.subscribe(t, s.open(t), dlq, dead.handler, append(earliest(sub), omnibus.Group("dlq-reader"))...)
	run(t, kd)
	ok := newCollector()
	poison := map[string]bool{}
	var mu sync.Mutex
	h := func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		p := poison[m.ID]
		mu.Unlock()
		if p {
			if m.Headers["kind"] == "permanent" {
				return omnibus.Permanent(errors.New("cannot parse"))
			}
			return errors.New("keeps failing")
		}
		ok.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Group("worker"), omnibus.MaxAttempts(3), omnibus.Backoff(5*time.Millisecond, 20*time.Millisecond))...)
	run(t, k)
	time.Sleep(200 * time.Millisecond)
	var ms []*omnibus.Message
	for i := range 60 {
		m := &omnibus.Message{ID: fmt.Sprintf("m%d-%x", i, rand.Uint32()), Key: fmt.Sprintf("k%d", i%6), Headers: map[string]string{}, Body: []byte("b")}
		switch i % 10 {
		case 3:
			m.Headers["kind"] = "permanent"
			poison[m.ID] = true
		case 7:
			m.Headers["kind"] = "exhausted"
			poison[m.ID] = true
		}
		ms = append(ms, m)
	}
	if err := pub.Publish(ctxT(t), topic, ms...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	Eventually(t, timeout, func() bool { return ok.unique() == 48 && dead.unique() == 12 }, func() string {
		return fmt.Sprintf("processed %d of 48, dead-lettered %d of 12", ok.unique(), dead.unique())
	})
	time.Sleep(300 * time.Millisecond) // a duplicate would show up now
	dead.mu.Lock()
	defer dead.mu.Unlock()
	for id, n := range dead.ids {
		m := dead.msgs[id]
		if n != 1 {
			t.Errorf("%s dead-lettered %d times, want once", id, n)
		}
		if !poison[id] {
			t.Errorf("%s dead-lettered but it was not poison", id)
		}
		wantAttempts := "3"
		if m.Headers["kind"] == "permanent" {
			wantAttempts = "1"
		}
		h := m.Headers
		if h[omnibus.HeaderDeadAttempts] != wantAttempts || h[omnibus.HeaderDeadTopic] != topic || h[omnibus.HeaderDeadGroup] != "worker" ||
			h[omnibus.HeaderDeadLane] == "" || h[omnibus.HeaderDeadReason] == "" || h[omnibus.HeaderDeadFirstFailure] == "" || h[omnibus.HeaderDeadLastFailure] == "" {
			t.Errorf("dead letter %s headers %v; want attempts %s, topic, group worker, lane, reason and failure times", id, h, wantAttempts)
		}
		if m.Key == "" || string(m.Body) != "b" {
			t.Errorf("dead letter %s lost its key or body: key %q body %q", id, m.Key, m.Body)
		}
	}
}

// testDeadLetterNamed dead-letters to a topic nobody created, with a name
// of the user's choosing: the transport must create and keep it.
func (s *suite) testDeadLetterNamed(t *testing.T) {
	pub := s.open(t)
	need(t, pub.Capabilities().Replay, "Replay")
	topic := s.topic(t, pub)
	dlq := topic + "-dead" // not ending in .dlq, and cleaned up with the topic
	k := s.subscribe(t, s.open(t), topic, func(ctx context.Context, m *omnibus.Message) error {
		return omnibus.Permanent(errors.New("rejected"))
	}, omnibus.StartFrom(omnibus.StartEarliest), omnibus.DeadLetterTopic(dlq))
	run(t, k)
	ids := publishN(t, pub, topic, 20, 4, 8)
	dead := newCollector()
	Eventually(t, timeout, func() bool {
		if dead.unique() > 0 {
			return true
		}
		// The topic appears with the first dead letter; read it from the start.
		kd, err := s.open(t).Subscribe(ctxT(t), dlq, dead.handler, omnibus.StartFrom(omnibus.StartEarliest))
		if err != nil {
			return false
		}
		t.Cleanup(func() { _ = kd.Close() })
		run(t, kd)
		return true
	}, func() string { return fmt.Sprintf("dead-letter topic %q never appeared", dlq) })
	Eventually(t, timeout, func() bool { return dead.unique() == len(ids) }, func() string {
		return fmt.Sprintf("%d of %d dead letters in %q", dead.unique(), len(ids), dlq)
	})
}

func (s *suite) testLag(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	caps := pub.Capabilities()
	need(t, caps.Lag != 0, "Lag")
	topic := s.topic(t, pub)
	release := make(chan struct{})
	col := newCollector()
	h := func(ctx context.Context, m *omnibus.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Group("lag"), omnibus.MaxInFlight(10))...)
	total := func() (int64, bool) {
		lags, err := k.Lag(ctxT(t))
		if err != nil {
			t.Fatalf("Lag: %v", err)
		}
		var sum int64
		for _, l := range lags {
			if !l.Known {
				return 0, false
			}
			sum += l.Lag
		}
		return sum, true
	}
	run(t, k)
	const n = 200
	publishN(t, pub, topic, n, 10, 8)
	var last int64
	Eventually(t, timeout, func() bool {
		lag, ok := total()
		last = lag
		return ok && lag >= n-20 && lag <= n
	}, func() string {
		return fmt.Sprintf("lag %d with %d unprocessed messages (at most 10 in flight)", last, n)
	})
	close(release)
	Eventually(t, timeout, func() bool {
		lag, ok := total()
		last = lag
		return ok && lag == 0 && col.unique() == n
	}, func() string { return fmt.Sprintf("lag %d after consuming %d of %d", last, col.unique(), n) })
	col.check(t, orderOf(pub), false)
}

func (s *suite) testShutdownCommits(t *testing.T) {
	pub := s.open(t)
	topic := s.topic(t, pub)
	first := newCollector()
	h := func(ctx context.Context, m *omnibus.Message) error {
		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		first.add(m)
		return nil
	}
	c1 := s.open(t)
	k := s.subscribe(t, c1, topic, h, append(earliest(pub), omnibus.Group("drain"))...)
	done := make(chan error, 1)
	go func() { done <- k.Run(context.Background()) }()
	const n = 1000
	ids := publishN(t, pub, topic, n, 20, 8)
	Eventually(t, timeout, func() bool { return first.unique() > n/3 }, func() string { return "no progress" })
	if err := k.Shutdown(ctxT(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	handled := first.unique()
	// The same group resumes after what was settled: nothing lost, and
	// nothing settled before the shutdown comes back.
	second := newCollector()
	k2 := s.subscribe(t, s.open(t), topic, second.handler, append(earliest(pub), omnibus.Group("drain"))...)
	run(t, k2)
	Eventually(t, timeout, func() bool {
		return first.unique()+second.unique() >= n && len(second.missing(first.missing(ids))) == 0
	}, func() string {
		return fmt.Sprintf("first run %d, second run %d, of %d", handled, second.unique(), n)
	})
	time.Sleep(300 * time.Millisecond)
	first.check(t, orderOf(pub), false)
	second.check(t, orderOf(pub), false)
	second.mu.Lock()
	defer second.mu.Unlock()
	again := 0
	for id := range second.ids {
		if first.ids[id] > 0 {
			again++
		}
	}
	if again > 0 {
		t.Errorf("%d messages settled before Shutdown were delivered again to the same group", again)
	}
}

func (s *suite) testCancel(t *testing.T) {
	c := s.open(t)
	topic := s.topic(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with a cancelled context: got %v, want context.Canceled", err)
	}
	started := make(chan struct{}, 1)
	k := s.subscribe(t, c, topic, func(ctx context.Context, m *omnibus.Message) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done() // a handler that waits for its context
		return ctx.Err()
	}, append(earliest(c), omnibus.DrainTimeout(time.Second))...)
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(rctx) }()
	time.Sleep(100 * time.Millisecond)
	publishN(t, c, topic, 5, 1, 8)
	select {
	case <-started:
	case <-time.After(timeout):
		t.Fatal("handler never started")
	}
	rcancel()
	select {
	case err := <-done:
		// The handlers return only when their context ends, at the
		// drain's deadline: Run reports what was left unsettled.
		var ue *omnibus.UnsettledError
		if err != nil && !errors.As(err, &ue) {
			t.Errorf("Run after cancellation: %v, want nil or an *UnsettledError", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's cancellation (DrainTimeout 1s)")
	}
}

func (s *suite) testClose(t *testing.T) {
	leaks := leakCheck(t)
	func() {
		c := s.h.Open(ctxT(t), t)
		topic := s.topic(t, c)
		col := newCollector()
		k, err := c.Subscribe(ctxT(t), topic, col.handler, earliest(c)...)
		if err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- k.Run(context.Background()) }()
		col.await(t, publishN(t, c, topic, 100, 4, 8))
		col.check(t, orderOf(c), false)
		if err := k.Close(); err != nil {
			t.Errorf("Consumer.Close: %v", err)
		}
		if err := k.Close(); err != nil {
			t.Errorf("second Consumer.Close: %v", err)
		}
		<-done
		if err := k.Shutdown(ctxT(t)); !errors.Is(err, omnibus.ErrClosed) {
			t.Errorf("Shutdown after Close: got %v, want ErrClosed", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Client.Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("second Client.Close: %v", err)
		}
		if err := c.Publish(ctxT(t), topic, &omnibus.Message{}); !errors.Is(err, omnibus.ErrClosed) {
			t.Errorf("Publish after Close: got %v, want ErrClosed", err)
		}
		if _, err := c.Subscribe(ctxT(t), topic, col.handler); !errors.Is(err, omnibus.ErrClosed) {
			t.Errorf("Subscribe after Close: got %v, want ErrClosed", err)
		}
	}()
	leaks()
}

func (s *suite) testReconnect(t *testing.T) {
	if s.h.Restart == nil {
		t.Skip("SKIP (harness Restart): this harness cannot restart its server; the transport's own restart test covers it")
	}
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Group("reconnect"))...)
	run(t, k)
	ids := publishN(t, pub, topic, 200, 4, 8)
	Eventually(t, timeout, func() bool { return col.unique() == 200 }, func() string { return "no delivery before restart" })
	// Once everything handled is committed, a restart has nothing to
	// deliver again: whatever comes back after it must still keep order.
	awaitNoLag(t, k)
	s.h.Restart(ctxT(t), t)
	ids = append(ids, publishN(t, pub, topic, 200, 4, 8)...)
	col.await(t, ids)
	col.check(t, orderOf(pub), true)
}

// awaitNoLag waits until the transport reports no lag for k's group, on
// transports that report lag.
func awaitNoLag(t *testing.T, k *omnibus.Consumer) {
	t.Helper()
	if k.Capabilities().Lag == 0 {
		return
	}
	var last []omnibus.LaneLag
	Eventually(t, timeout, func() bool {
		lags, err := k.Lag(ctxT(t))
		if err != nil {
			return false
		}
		last = lags
		for _, l := range lags {
			if !l.Known || l.Lag != 0 {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("lag never reached 0: %+v", last) })
}

package transporttest

// Dead letters: what a dead letter carries, a dead-letter topic nobody
// created, and (hostile) dead-letter topics that refuse a message, which
// must hold its key without stalling the others and never lose it. The
// tests run on the test's goroutine; handlers and observers run on the
// consumer's goroutines and record into collectors and atomics; errorLog,
// the worker's log, is guarded by its mutex.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

func (s *suite) testDeadLetter(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	dlq := topic + ".dlq"
	if err := pub.CreateTopic(ctxT(t), dlq, 1); err != nil {
		t.Fatalf("CreateTopic(%q): %v", dlq, err)
	}
	dead := newCollector()
	kd := s.subscribe(t, s.open(t), dlq, dead.handler, append(earliest(sub), omnibus.Group("dlq-reader"))...)
	RunConsumer(t, kd)
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
	RunConsumer(t, k)
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
		if n > 1+copiesAllowed(t, id) { // copies: dead letters published again (Harness.ResendsStoredTwice)
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
	RunConsumer(t, k)
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
		RunConsumer(t, kd)
		return true
	}, func() string { return fmt.Sprintf("dead-letter topic %q never appeared", dlq) })
	Eventually(t, timeout, func() bool { return dead.unique() == len(ids) }, func() string {
		return fmt.Sprintf("%d of %d dead letters in %q", dead.unique(), len(ids), dlq)
	})
}

// --- dead-letter topics that refuse ---

// testDeadLetterRejected fails messages permanently where their dead
// letters cannot land. What must hold, as DeadLetterTopic documents it: a
// reason too long for the limit is cut to fit and the letter lands; a
// letter that cannot land holds its key (nothing after it on that key is
// handled), is tried again after a backoff with an ERROR each time, at
// most every BackoffMax, while the other keys go on; and it is never
// lost: it lands, or the group gets the message again.
func (s *suite) testDeadLetterRejected(t *testing.T) {
	t.Run("TooLarge", func(t *testing.T) {
		pub := s.open(t)
		max := pub.Capabilities().MaxMessageBytes
		if max == 0 {
			t.Skip("SKIP (capability MaxMessageBytes): the transport declares no size limit")
		}
		if max > 16<<20 {
			t.Skipf("SKIP (capability MaxMessageBytes): %d bytes is too large to fill in a test", max)
		}
		topic := s.topic(t, pub)
		dlq := topic + ".dlq"
		if err := pub.CreateTopic(ctxT(t), dlq, 1); err != nil {
			t.Fatalf("CreateTopic(%q): %v", dlq, err)
		}
		publish := func(id, key string, margin int) error {
			m := &omnibus.Message{ID: id, Key: key, Type: "test.event", Headers: map[string]string{}}
			m.Body = make([]byte, max-margin-len(m.ID)-len(m.Key)-len(m.Type))
			return pub.Publish(ctxT(t), topic, m)
		}
		s.poisonDoesNotStall(t, pub, topic, dlq, func(poison, trim string) bool {
			// The poison is as large as the transport takes: no reason
			// fits. The other leaves room for the headers, not for the
			// whole reason.
			if err := publish(trim, "trim", len(poisonReason)/2); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			for _, margin := range []int{0, 256, 1 << 10, 4 << 10, 16 << 10} {
				err := publish(poison, "poison", margin)
				if err == nil {
					t.Logf("poison message %d bytes under the limit of %d", margin, max)
					return true
				}
				if !errors.Is(err, omnibus.ErrTooLarge) {
					t.Fatalf("Publish of %d bytes: %v", max-margin, err)
				}
			}
			t.Fatalf("no message within 16 KiB of MaxMessageBytes %d was accepted", max)
			return false
		})
	})
	t.Run("InvalidTopic", func(t *testing.T) {
		pub := s.open(t)
		topic := s.topic(t, pub)
		// A reserved prefix for RabbitMQ, spaces and wildcards for NATS
		// and Kafka.
		dlq := "amq.dead letters *>"
		s.poisonDoesNotStall(t, pub, topic, dlq, func(poison, _ string) bool {
			if err := pub.Publish(ctxT(t), topic, &omnibus.Message{ID: poison, Key: "poison", Body: []byte("poison")}); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			return false
		}, omnibus.DeadLetterTopic(dlq))
	})
}

// The worker's retries in poisonDoesNotStall, and the least time over
// which it counts the engine's errors.
const (
	poisonBackoffMin = 5 * time.Millisecond
	poisonBackoffMax = 250 * time.Millisecond
	errorWindow      = 3 * time.Second
)

// poisonReason is the reason a poison message fails with: long, so that
// its dead letter is larger than the message.
var poisonReason = "cannot parse: " + strings.Repeat("r", 32<<10)

// poisonDoesNotStall runs a group on topic whose handler fails two
// messages permanently, the poison and (when publish sends it) one whose
// dead letter fits once its reason is cut, and handles the rest, with
// dead letters going to dlq. publish sends them, given their IDs, and
// says whether it sent the second.
func (s *suite) poisonDoesNotStall(t *testing.T, pub *omnibus.Client, topic, dlq string, publish func(poison, trim string) bool, opts ...omnibus.SubscribeOption) {
	markGoroutines(t)
	// The dead-letter topic's reader, where the transport lets one read
	// it (where it can replay, it may read it later instead).
	dead := newCollector()
	read := func(opts ...omnibus.SubscribeOption) error {
		kd, err := s.open(t).Subscribe(ctxT(t), dlq, dead.handler, opts...)
		if err != nil {
			return err
		}
		t.Cleanup(func() { within(t, cleanupWait, "Consumer.Close", func() { _ = kd.Close() }) })
		RunConsumer(t, kd)
		return nil
	}
	reading := read(earliest(pub)...) == nil
	landed := func(id string) bool { return len(dead.missing([]string{id})) == 0 }
	// The worker's client logs into errs.
	errs := &errorLog{}
	sub, err := omnibus.New(s.open(t).Driver(), omnibus.WithLogger(slog.New(errs)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	poison := "poison-" + strconv.FormatUint(rand.Uint64(), 36)
	trim := "trim-" + strconv.FormatUint(rand.Uint64(), 36)
	ok := newCollector()
	var tries, failed atomic.Int64 // of the poison
	h := func(ctx context.Context, m *omnibus.Message) error {
		if m.ID == poison || m.ID == trim {
			if m.ID == poison {
				tries.Add(1)
			}
			return omnibus.Permanent(errors.New(poisonReason))
		}
		ok.add(m)
		return nil
	}
	observe := func(e omnibus.Event) {
		if e.Kind == omnibus.EventDeadLetterFailed && e.Message != nil && e.Message.ID == poison {
			failed.Add(1)
		}
	}
	opts = append(append(earliest(pub), omnibus.Group("worker"), omnibus.MaxInFlight(4), omnibus.MaxAttempts(2),
		omnibus.Backoff(poisonBackoffMin, poisonBackoffMax), omnibus.DrainTimeout(2*time.Second), omnibus.Observe(observe)), opts...)
	k, err := sub.Subscribe(ctxT(t), topic, h, opts...)
	if err != nil {
		// Refusing the dead-letter topic up front is the best outcome.
		t.Logf("Subscribe refused the dead-letter topic: %v", err)
		return
	}
	t.Cleanup(func() { within(t, cleanupWait, "Consumer.Close", func() { _ = k.Close() }) })
	began := time.Now()
	runStuck(t, k)
	sentTrim := publish(poison, trim)
	behind := publishKeys(t, pub, topic, 1, 8, func(int) string { return "poison" })
	healthy := publishKeys(t, pub, topic, 500, 8, func(i int) string { return "healthy" + strconv.Itoa(i%20) })
	flowed := poll(30*time.Second, func() bool { return len(ok.missing(healthy)) == 0 })
	if !flowed {
		t.Errorf("other keys stalled behind a dead letter that cannot land: %d of %d healthy messages handled in 30s (poison tried %d times)",
			len(healthy)-len(ok.missing(healthy)), len(healthy), tries.Load())
	}
	// Errors counted over a few seconds at least: a loop shows by then.
	// The backoff doubles from its minimum to its maximum, with jitter
	// down to half, then stays there.
	time.Sleep(time.Until(began.Add(errorWindow)))
	elapsed := time.Since(began)
	most := 2 + int(elapsed/(poisonBackoffMax/2))
	for d := poisonBackoffMin; d < poisonBackoffMax; d *= 2 {
		most++
	}
	n, last := errs.count(poison)
	// Where the dead-letter topic cannot be read yet, the errors say
	// whether the letter failed to land.
	unlanded := (reading && !landed(poison)) || (!reading && n > 0)
	switch {
	case tries.Load() == 0:
		t.Errorf("the poison was never handled")
	case !unlanded:
		t.Logf("the poison's dead letter landed in %q (%d errors before)", dlq, n)
	case n > most:
		t.Errorf("the engine logged %d errors about the poison in %v, more than one a backoff (Backoff(%v, %v): at most %d); the last: %s",
			n, elapsed.Round(time.Millisecond), poisonBackoffMin, poisonBackoffMax, most, last)
	case n == 0 || failed.Load() == 0:
		t.Errorf("a dead letter that did not land was reported by %d ERROR logs and %d EventDeadLetterFailed; want both", n, failed.Load())
	}
	if orderOf(pub) == keyOrder && unlanded && len(ok.missing(behind)) == 0 {
		t.Errorf("a message behind the poison on its key was handled while the poison's dead letter had not landed")
	}
	ok.check(t, orderOf(pub), false)
	if sentTrim {
		if !reading || !poll(10*time.Second, func() bool { return landed(trim) }) {
			t.Errorf("a dead letter that fits once its reason is cut did not land in %q", dlq)
		} else {
			dead.mu.Lock()
			reason := dead.msgs[trim].Headers[omnibus.HeaderDeadReason]
			dead.mu.Unlock()
			if len(reason) >= len(poisonReason) || !strings.HasPrefix(poisonReason, reason) {
				t.Errorf("a dead letter's reason of %d bytes that did not fit landed as %d bytes, want it cut from the end", len(poisonReason), len(reason))
			}
		}
	}
	// Not lost: it landed in the dead-letter topic, or the group gets it
	// again once this member is gone.
	if !within(t, hang, "Consumer.Close", func() { _ = k.Close() }) {
		return
	}
	if !reading && pub.Capabilities().Replay {
		reading = read(omnibus.StartFrom(omnibus.StartEarliest)) == nil // the topic exists now
	}
	if reading && poll(2*time.Second, func() bool { return landed(poison) }) {
		return
	}
	again := newCollector()
	RunConsumer(t, s.subscribe(t, s.open(t), topic, again.handler, append(earliest(pub), omnibus.Group("worker"))...))
	Eventually(t, 30*time.Second, func() bool { return len(again.missing([]string{poison})) == 0 }, func() string {
		return fmt.Sprintf("the poison message was neither dead-lettered (%d in %q) nor delivered to its group again: lost", dead.unique(), dlq)
	})
}

// errorLog keeps the records logged at ERROR and above, as text.
type errorLog struct {
	mu      sync.Mutex
	records []string
}

func (h *errorLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }

func (h *errorLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%.1000s", a.Key, a.Value.String())
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, b.String())
	return nil
}

func (h *errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorLog) WithGroup(string) slog.Handler      { return h }

// count is the number of records that mention s, and the last of them.
func (h *errorLog) count(s string) (n int, last string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if strings.Contains(r, s) {
			n, last = n+1, r
		}
	}
	return n, last
}

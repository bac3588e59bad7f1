package transporttest

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// The hostile tests: handlers slower than the ack deadline, groups deleted
// behind their members' backs, dead-letter topics that refuse, callbacks
// that call back in, contexts ignored, retries and revocations that must
// not stall what they do not concern, and bounds that must hold.

// hang bounds a call that must not block: one still running after it
// fails the test with the goroutines' stacks.
const hang = 10 * time.Second

// start runs k.Run in a goroutine and returns its result's channel.
func start(ctx context.Context, k *omnibus.Consumer) <-chan error {
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	return done
}

// awaitRun waits up to d for Run to return, and fails t with the
// goroutines' stacks when it does not.
func awaitRun(t *testing.T, done <-chan error, d time.Duration) (error, bool) {
	t.Helper()
	select {
	case err := <-done:
		return err, true
	case <-time.After(d):
		t.Errorf("Run did not return within %v; goroutines:\n%s", d, stacks(t))
		return nil, false
	}
}

// released returns a channel for handlers to wait on and the function
// that closes it (once, however often it is called). A test registers the
// function as a cleanup after subscribing, so that it runs before the
// consumer is closed.
func released() (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	return ch, func() { once.Do(func() { close(ch) }) }
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

// --- handlers slower than the ack deadline ---

// testSlowHandler keeps messages waiting for a handler longer than the
// transport's ack deadline, queued behind a small MaxInFlight or held by
// handlers that take longer than the deadline each: none may be lost, and
// a redelivery may not be handled after a newer message of its key was
// settled. Duplicates are counted.
func (s *suite) testSlowHandler(t *testing.T) {
	d := s.h.AckDeadline
	if d == 0 {
		t.Skip("SKIP (harness AckDeadline): the transport has no ack deadline within a test's length")
	}
	t.Run("Queued", func(t *testing.T) {
		// One key, handled one message at a time for several deadlines.
		const each = 40 * time.Millisecond
		n := max(120, int(4*d/each))
		s.slowHandler(t, each, omnibus.MaxInFlight(2), func(pub *omnibus.Client, topic string) []string {
			return publishKeys(t, pub, topic, n, 8, func(int) string { return "key" })
		})
	})
	t.Run("BeyondDeadline", func(t *testing.T) {
		// Handlers of keys slow0 and slow1 take longer than the deadline
		// each; the other keys' messages wait behind them.
		s.slowHandler(t, d*3/2, omnibus.MaxInFlight(4), func(pub *omnibus.Client, topic string) []string {
			ids := publishKeys(t, pub, topic, 6, 8, func(i int) string { return "slow" + strconv.Itoa(i%2) })
			return append(ids, publishKeys(t, pub, topic, 40, 8, func(i int) string { return "fast" + strconv.Itoa(i%4) })...)
		})
	})
}

// slowHandler runs a handler taking slow for messages of keys starting
// with "slow" or named "key", and 10ms for the others, over what publish
// sends.
func (s *suite) slowHandler(t *testing.T, slow time.Duration, limit omnibus.SubscribeOption, publish func(*omnibus.Client, string) []string) {
	markGoroutines(t)
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	var calls atomic.Int64
	h := func(ctx context.Context, m *omnibus.Message) error {
		calls.Add(1)
		if m.Key == "key" || strings.HasPrefix(m.Key, "slow") {
			time.Sleep(slow)
		} else {
			time.Sleep(10 * time.Millisecond)
		}
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), limit)...)
	stop := run(t, k)
	ids := publish(pub, topic)
	col.await(t, ids)
	stop()
	t.Logf("%d messages, %d handler calls (ack deadline %v, handler %v)", len(ids), calls.Load(), s.h.AckDeadline, slow)
	col.check(t, orderOf(pub), true)
}

// --- a group's state deleted behind its back ---

// testGroupDeleted deletes what the server keeps of a group: the group
// must still get every message published while it was stopped, and
// everything published after the deletion while it runs. A group whose
// position is gone may read again what it had settled (duplicates), but
// never skips.
func (s *suite) testGroupDeleted(t *testing.T) {
	if s.h.DeleteGroup == nil {
		t.Skip("SKIP (harness DeleteGroup): the harness cannot delete a group's state apart from its messages")
	}
	const group = "deleted"
	t.Run("WhileStopped", func(t *testing.T) {
		pub := s.open(t)
		topic := s.topic(t, pub)
		first := newCollector()
		k := s.subscribe(t, s.open(t), topic, first.handler, append(earliest(pub), omnibus.Group(group))...)
		stop := run(t, k)
		first.await(t, publishN(t, pub, topic, 10, 4, 8))
		awaitNoLag(t, k)
		stop()
		ids := publishN(t, pub, topic, 20, 4, 8)
		s.h.DeleteGroup(ctxT(t), t, topic, group)
		// The group comes back without asking for the earliest: it
		// exists, so it must not start at the end.
		again := newCollector()
		run(t, s.subscribe(t, s.open(t), topic, again.handler, omnibus.Group(group)))
		again.awaitWithin(t, 30*time.Second, ids)
		first.check(t, orderOf(pub), false)
		again.check(t, orderOf(pub), true)
	})
	t.Run("WhileRunning", func(t *testing.T) {
		pub := s.open(t)
		topic := s.topic(t, pub)
		before, after := newCollector(), newCollector()
		var cur atomic.Pointer[collector]
		cur.Store(before)
		h := func(ctx context.Context, m *omnibus.Message) error {
			cur.Load().add(m)
			return nil
		}
		k := s.subscribe(t, s.open(t), topic, h, append(earliest(pub), omnibus.Group(group))...)
		stop := run(t, k)
		before.await(t, publishN(t, pub, topic, 20, 4, 8))
		awaitNoLag(t, k) // nothing in flight: whatever comes after is in order
		cur.Store(after)
		s.h.DeleteGroup(ctxT(t), t, topic, group)
		ids := publishN(t, pub, topic, 20, 4, 8)
		after.awaitWithin(t, 30*time.Second, ids)
		stop()
		before.check(t, orderOf(pub), false)
		after.check(t, orderOf(pub), true)
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
		run(t, kd)
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
	run(t, s.subscribe(t, s.open(t), topic, again.handler, append(earliest(pub), omnibus.Group("worker"))...))
	Eventually(t, 30*time.Second, func() bool { return len(again.missing([]string{poison})) == 0 }, func() string {
		return fmt.Sprintf("the poison message was neither dead-lettered (%d in %q) nor delivered to its group again: lost", dead.unique(), dlq)
	})
}

// --- callbacks that call back in ---

// testObserverCallsBack calls the consumer from its own observer: Stats
// and Lag on every kind of event (retries included), and Close or
// Shutdown. Nothing may deadlock.
func (s *suite) testObserverCallsBack(t *testing.T) {
	t.Run("StatsAndLag", func(t *testing.T) {
		pub, sub := s.open(t), s.open(t)
		topic := s.topic(t, pub)
		var kp atomic.Pointer[omnibus.Consumer]
		var events, lags atomic.Int64
		observe := func(e omnibus.Event) {
			k := kp.Load()
			if k == nil {
				return
			}
			n := events.Add(1)
			_ = k.Stats()
			if k.Capabilities().Lag != 0 && (e.Kind != omnibus.EventProcessed || n%50 == 0) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = k.Lag(ctx)
				cancel()
				lags.Add(1)
			}
		}
		col := newCollector()
		h := func(ctx context.Context, m *omnibus.Message) error {
			if m.Attempt == 1 && crc32.ChecksumIEEE([]byte(m.ID))%4 == 0 {
				return errors.New("injected failure")
			}
			col.add(m)
			return nil
		}
		k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.Observe(observe), omnibus.Backoff(5*time.Millisecond, 20*time.Millisecond))...)
		kp.Store(k)
		done := start(context.Background(), k)
		ids := publishN(t, pub, topic, 200, 10, 8)
		Eventually(t, 30*time.Second, func() bool { return len(col.missing(ids)) == 0 }, func() string {
			return fmt.Sprintf("%d of %d handled with an observer calling Stats and Lag (%d events, %d Lag calls); goroutines:\n%s",
				col.unique(), len(ids), events.Load(), lags.Load(), stacks(t))
		})
		if within(t, hang, "Consumer.Close", func() { _ = k.Close() }) {
			awaitRun(t, done, hang)
		}
		t.Logf("%d events observed, %d Lag calls from the observer", events.Load(), lags.Load())
	})
	t.Run("Close", func(t *testing.T) {
		s.observerStops(t, func(k *omnibus.Consumer) error { return k.Close() })
	})
	t.Run("Shutdown", func(t *testing.T) {
		s.observerStops(t, func(k *omnibus.Consumer) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return k.Shutdown(ctx)
		})
	})
}

// observerStops calls stop from the observer, at the first message
// processed: stop, Run and the client's Close return, and no goroutine is
// left.
func (s *suite) observerStops(t *testing.T, stop func(*omnibus.Consumer) error) {
	markGoroutines(t)
	leaks := leakCheck(t)
	c := s.open(t)
	topic := s.topic(t, c)
	var kp atomic.Pointer[omnibus.Consumer]
	var called atomic.Bool
	returned := make(chan error, 1)
	observe := func(e omnibus.Event) {
		if k := kp.Load(); k != nil && e.Kind == omnibus.EventProcessed && called.CompareAndSwap(false, true) {
			returned <- stop(k)
		}
	}
	k, err := c.Subscribe(ctxT(t), topic, func(context.Context, *omnibus.Message) error { return nil }, append(earliest(c), omnibus.Observe(observe))...)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	kp.Store(k)
	done := start(context.Background(), k)
	publishN(t, c, topic, 20, 4, 8)
	select {
	case err := <-returned:
		t.Logf("called from the observer: %v", err)
	case <-time.After(hang):
		t.Fatalf("called from the observer, it did not return within %v; goroutines:\n%s", hang, stacks(t))
	}
	closeAll(t, k, done, c, leaks)
}

// closeAll closes k from outside, whatever a call from inside it
// answered, waits for its Run (done) to return, closes c and checks that
// no goroutine is left, each step bounded.
func closeAll(t *testing.T, k *omnibus.Consumer, done <-chan error, c *omnibus.Client, leaks func()) {
	t.Helper()
	if !within(t, hang, "Consumer.Close", func() { _ = k.Close() }) {
		return
	}
	if _, ok := awaitRun(t, done, hang); !ok {
		return
	}
	if within(t, hang, "Client.Close", func() { _ = c.Close() }) {
		leaks()
	}
}

// --- handlers that ignore their context ---

// testHandlerIgnoresContext stops a consumer whose handlers ignore their
// context: Shutdown, Scale and Run's drain return by their deadline with
// the messages left unsettled, and Close after such a Shutdown returns.
// (Close alone waits for the handlers, as documented.)
func (s *suite) testHandlerIgnoresContext(t *testing.T) {
	// Shutdown commits what is settled with a short grace after its
	// deadline; beyond this the call is stuck.
	const deadline, grace = time.Second, 3 * time.Second
	t.Run("Shutdown", func(t *testing.T) {
		k, _, _ := s.stuckHandlers(t, 1)
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		var err error
		if within(t, deadline+grace, "Shutdown", func() { err = k.Shutdown(ctx) }) {
			checkUnsettled(t, "Shutdown", err)
			within(t, grace, "Close after Shutdown", func() { _ = k.Close() })
		}
	})
	t.Run("RunDrain", func(t *testing.T) {
		_, cancel, done := s.stuckHandlers(t, 1, omnibus.DrainTimeout(deadline))
		began := time.Now()
		cancel()
		if err, ok := awaitRun(t, done, deadline+grace); ok {
			t.Logf("Run returned after %v", time.Since(began).Round(time.Millisecond))
			checkUnsettled(t, "Run's drain", err)
		}
	})
	t.Run("ScaleDown", func(t *testing.T) {
		k, _, _ := s.stuckHandlers(t, 2, omnibus.DrainTimeout(deadline))
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		var err error
		if within(t, deadline+grace, "Scale(1)", func() { err = k.Scale(ctx, 1) }) {
			checkUnsettled(t, "Scale(1)", err)
		}
	})
}

// stuckHandlers subscribes members whose handlers wait, ignoring their
// context, until the test ends, and returns once every member runs one.
// cancel cancels Run's context; done has Run's result.
func (s *suite) stuckHandlers(t *testing.T, members int, opts ...omnibus.SubscribeOption) (k *omnibus.Consumer, cancel context.CancelFunc, done <-chan error) {
	markGoroutines(t)
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	wait, release := released()
	h := func(context.Context, *omnibus.Message) error {
		<-wait
		return nil
	}
	k = s.subscribe(t, sub, topic, h, append(earliest(sub), append([]omnibus.SubscribeOption{omnibus.Members(members)}, opts...)...)...)
	t.Cleanup(release) // before the consumer's Close
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done = start(ctx, k)
	// Keep publishing until every member holds a message: on some
	// transports a member gets lanes only when another gives them up.
	var last time.Time
	Eventually(t, timeout, func() bool {
		if len(busyMembers(k)) == members {
			return true
		}
		if time.Since(last) > 200*time.Millisecond {
			publishN(t, pub, topic, 20, 20, 8)
			last = time.Now()
		}
		return false
	}, func() string {
		return fmt.Sprintf("not every one of %d members got a message: %+v", members, k.Stats().Lanes)
	})
	return k, cancel, done
}

func checkUnsettled(t *testing.T, what string, err error) {
	t.Helper()
	var ue *omnibus.UnsettledError
	if !errors.As(err, &ue) || !errors.Is(err, context.DeadlineExceeded) || ue.Count == 0 {
		t.Errorf("%s with handlers running past its deadline: got %v, want an *UnsettledError counting them and wrapping context.DeadlineExceeded", what, err)
	}
}

// laneOwner is the member holding lane, or -1 when Stats does not show
// one member alone holding it (a broker's lane is every member's).
func laneOwner(k *omnibus.Consumer, lane string) int {
	owner := -1
	for _, l := range k.Stats().Lanes {
		if l.Lane == lane {
			if owner >= 0 || l.Member < 0 {
				return -1
			}
			owner = l.Member
		}
	}
	return owner
}

// busyMembers is the set of members with messages in flight.
func busyMembers(k *omnibus.Consumer) map[int]bool {
	busy := map[int]bool{}
	for _, l := range k.Stats().Lanes {
		if l.Member >= 0 && l.InFlight > 0 {
			busy[l.Member] = true
		}
	}
	return busy
}

// --- what one key or lane does must not stall the others ---

// testRetryingKey keeps one message failing while messages of other keys
// arrive, with a small MaxInFlight: they are handled promptly, and in
// ordered modes nothing of the failing key overtakes it.
func (s *suite) testRetryingKey(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	ordered := pub.Capabilities().Ordered
	stuck := "stuck-" + strconv.FormatUint(rand.Uint64(), 36)
	col := newCollector()
	var tries, overtook atomic.Int64
	h := func(ctx context.Context, m *omnibus.Message) error {
		if m.ID == stuck {
			tries.Add(1)
			return errors.New("injected failure")
		}
		if m.Key == "stuck" && ordered {
			overtook.Add(1)
		}
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.MaxInFlight(4), omnibus.MaxAttempts(1<<20),
		omnibus.Backoff(20*time.Millisecond, 100*time.Millisecond), omnibus.DrainTimeout(2*time.Second))...)
	stop := runStuck(t, k)
	if err := pub.Publish(ctxT(t), topic, &omnibus.Message{ID: stuck, Key: "stuck", Body: []byte("x")}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	publishKeys(t, pub, topic, 20, 8, func(int) string { return "stuck" })
	others := publishKeys(t, pub, topic, 50, 8, func(i int) string { return "other" + strconv.Itoa(i%10) })
	Eventually(t, 15*time.Second, func() bool { return len(col.missing(others)) == 0 }, func() string {
		return fmt.Sprintf("%d of %d messages of other keys handled while one key retried (%d tries)",
			len(others)-len(col.missing(others)), len(others), tries.Load())
	})
	Eventually(t, 15*time.Second, func() bool { return tries.Load() >= 2 }, func() string {
		return fmt.Sprintf("the failing message was tried %d times; want it still retrying", tries.Load())
	})
	if n := overtook.Load(); n > 0 {
		t.Errorf("%d messages of the retrying key were handled before it settled", n)
	}
	stop()
	col.check(t, orderOf(pub), false)
}

// testRevocationKeepsOtherLanes revokes a lane whose handler holds on
// (the drain waits for it) and measures, per lane, how long messages
// published meanwhile wait: the lanes the member keeps go on flowing.
func (s *suite) testRevocationKeepsOtherLanes(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	need(t, pub.Capabilities().ExclusiveLanes, "ExclusiveLanes")
	if s.h.Lanes < 2 {
		t.Skip("SKIP (harness Lanes): with one lane nothing stays when a lane moves")
	}
	topic := s.topic(t, pub)
	wait, release := released()
	var mu sync.Mutex
	blocked := map[string]bool{}        // lanes with a handler holding on
	worst := map[string]time.Duration{} // per lane, the longest a probe waited
	h := func(ctx context.Context, m *omnibus.Message) error {
		if strings.HasPrefix(m.Key, "block") {
			mu.Lock()
			blocked[m.Lane] = true
			mu.Unlock()
			select {
			case <-wait:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		waited := time.Since(m.Time)
		mu.Lock()
		worst[m.Lane] = max(worst[m.Lane], waited)
		mu.Unlock()
		return nil
	}
	probes := newCollector()
	k := s.subscribe(t, sub, topic, func(ctx context.Context, m *omnibus.Message) error {
		if err := h(ctx, m); err != nil {
			return err
		}
		probes.add(m)
		return nil
	}, append(earliest(sub), omnibus.DrainTimeout(30*time.Second))...)
	t.Cleanup(release)
	stop := run(t, k)
	// A handler holds on in every lane.
	publishKeys(t, pub, topic, 64, 8, func(i int) string { return "block" + strconv.Itoa(i) })
	Eventually(t, timeout, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(blocked) == s.h.Lanes
	}, func() string { return fmt.Sprintf("handlers hold on in lanes %v, want all %d", blocked, s.h.Lanes) })
	// A second member joins: the first gives lanes up, and each drain
	// waits for the handler holding on. Messages keep coming meanwhile.
	scaled := make(chan error, 1)
	go func() { scaled <- k.Scale(ctxT(t), 2) }()
	const window, stall = 6 * time.Second, 2500 * time.Millisecond
	var ids []string
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		ids = append(ids, publishKeys(t, pub, topic, 40, 8, func(i int) string { return "probe" + strconv.Itoa(i) })...)
	}
	release()
	probes.await(t, ids)
	select {
	case err := <-scaled:
		if err != nil {
			t.Fatalf("Scale(2): %v", err)
		}
	case <-time.After(timeout):
		t.Fatalf("Scale(2) did not return within %v of the handlers' release", timeout)
	}
	var kept []string
	Eventually(t, timeout, func() bool {
		kept = kept[:0]
		members := map[int]bool{}
		for _, l := range k.Stats().Lanes {
			members[l.Member] = true
			if l.Member == 0 {
				kept = append(kept, l.Lane)
			}
		}
		return members[0] && members[1]
	}, func() string { return fmt.Sprintf("lanes not split over 2 members: %+v", k.Stats().Lanes) })
	stop()
	mu.Lock()
	defer mu.Unlock()
	var stalled []string
	for lane, d := range worst {
		if d > stall {
			stalled = append(stalled, lane)
		}
	}
	slices.Sort(stalled)
	t.Logf("per lane, the longest a message waited: %v; member 0 kept %v", worst, kept)
	if len(stalled) == 0 {
		t.Fatalf("no lane waited for a drain in the %v window: the revocation came too late to measure anything", window)
	}
	for _, lane := range kept {
		if worst[lane] > stall {
			t.Errorf("lane %s stayed with its member, yet a message on it waited %v while other lanes drained", lane, worst[lane].Round(time.Millisecond))
		}
	}
	// Messages of the drained lanes waited the whole window: beyond an ack
	// deadline, a transport may deliver them twice, never out of order.
	probes.check(t, keyOrder, s.h.AckDeadline > 0 && s.h.AckDeadline < window)
}

// --- calls from inside a handler ---

// testHandlerCallsBack calls Close, Shutdown and Scale from inside a
// handler: each returns (an error is fine), the consumer stops, and no
// goroutine is left.
func (s *suite) testHandlerCallsBack(t *testing.T) {
	t.Run("Close", func(t *testing.T) {
		s.handlerCalls(t, 1, func(k *omnibus.Consumer) error { return k.Close() })
	})
	t.Run("Shutdown", func(t *testing.T) {
		s.handlerCalls(t, 1, func(k *omnibus.Consumer) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return k.Shutdown(ctx)
		})
	})
	t.Run("ScaleDown", func(t *testing.T) {
		s.handlerCalls(t, 2, func(k *omnibus.Consumer) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return k.Scale(ctx, 1)
		})
	})
}

// handlerCalls runs call from inside a handler of a consumer of members
// members: with more than one, from a handler of the newest member (the
// one Scale removes) where the lanes tell members apart, and from
// handlers of every member where they do not.
func (s *suite) handlerCalls(t *testing.T, members int, call func(*omnibus.Consumer) error) {
	markGoroutines(t)
	leaks := leakCheck(t)
	c := s.open(t)
	topic := s.topic(t, c)
	var kp atomic.Pointer[omnibus.Consumer]
	var claimed atomic.Bool // with one member: the handler that calls
	var called atomic.Bool  // a handler made the call, or is making it
	var inCall atomic.Int64 // calls not returned yet
	var mu sync.Mutex
	var results []string
	h := func(ctx context.Context, m *omnibus.Message) error {
		k := kp.Load()
		if k == nil || called.Load() {
			return nil
		}
		from := "the only member"
		if members == 1 && !claimed.CompareAndSwap(false, true) {
			return nil
		}
		if members > 1 {
			// Scale removes the newest member: the call must come from
			// it. Where one member holds the lane, the handler knows
			// whose it is; elsewhere every handler calls once every
			// member runs one.
			switch owner := laneOwner(k, m.Lane); {
			case owner >= 0 && owner != members-1:
				return nil
			case owner >= 0:
				from = "the member removed"
			default:
				for end := time.Now().Add(hang); len(busyMembers(k)) < members && time.Now().Before(end) && ctx.Err() == nil; {
					time.Sleep(10 * time.Millisecond)
				}
				from = fmt.Sprintf("any member (%d of %d running a handler)", len(busyMembers(k)), members)
			}
		}
		inCall.Add(1)
		called.Store(true)
		defer inCall.Add(-1)
		began := time.Now()
		err := call(k)
		mu.Lock()
		results = append(results, fmt.Sprintf("from %s: %v after %v", from, err, time.Since(began).Round(time.Millisecond)))
		mu.Unlock()
		return nil
	}
	k, err := c.Subscribe(ctxT(t), topic, h, append(earliest(c), omnibus.Members(members), omnibus.DrainTimeout(2*time.Second))...)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	kp.Store(k)
	done := start(context.Background(), k)
	// Messages keep coming until a handler calls: on some transports the
	// newest member gets lanes only when another gives them up.
	var last time.Time
	Eventually(t, timeout, func() bool {
		if !called.Load() && time.Since(last) > 200*time.Millisecond {
			publishN(t, c, topic, 20, 20, 8)
			last = time.Now()
		}
		return called.Load()
	}, func() string { return fmt.Sprintf("no handler called; lanes %+v", k.Stats().Lanes) })
	for end := time.Now().Add(hang); inCall.Load() > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("called from inside a handler, it did not return within %v; goroutines:\n%s", hang, stacks(t))
		}
	}
	mu.Lock()
	t.Logf("called from inside handlers: %v", results)
	mu.Unlock()
	closeAll(t, k, done, c, leaks)
}

// --- bounds ---

// testMaxInFlightBytes sends one small message, so the engine learns a
// small size, then large ones: the bytes in flight never pass the bound
// by more than one message.
func (s *suite) testMaxInFlightBytes(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	const bound, size = 1 << 20, 100 << 10
	col := newCollector()
	var kp atomic.Pointer[omnibus.Consumer]
	var peak atomic.Int64
	h := func(ctx context.Context, m *omnibus.Message) error {
		if k := kp.Load(); k != nil {
			n := int64(k.Stats().InFlight)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
		}
		time.Sleep(2 * time.Millisecond)
		col.add(m)
		return nil
	}
	k := s.subscribe(t, sub, topic, h, append(earliest(sub), omnibus.MaxInFlightBytes(bound))...)
	kp.Store(k)
	stop := run(t, k)
	col.await(t, publishN(t, pub, topic, 1, 1, 10))
	col.await(t, publishN(t, pub, topic, 200, 20, size))
	stop()
	if most := int64(bound/size + 1); peak.Load() > most {
		t.Errorf("%d messages of %d KiB in flight at once (%d KiB) with MaxInFlightBytes %d KiB; want at most %d (the bound and one message)",
			peak.Load(), size>>10, peak.Load()*size>>10, bound>>10, most)
	}
	col.check(t, orderOf(pub), false)
}

// --- failures reported ---

// testShutdownReportsFailedCommit makes the server refuse commits before
// Shutdown: Shutdown says so, and the group gets the messages again.
func (s *suite) testShutdownReportsFailedCommit(t *testing.T) {
	if s.h.FailCommits == nil {
		t.Skip("SKIP (harness FailCommits): the harness cannot make commits fail; the engine's own tests cover the report")
	}
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	col := newCollector()
	k := s.subscribe(t, sub, topic, col.handler, append(earliest(sub), omnibus.Group("commit"))...)
	done := start(context.Background(), k)
	col.await(t, publishN(t, pub, topic, 10, 4, 8))
	awaitNoLag(t, k)
	restore := s.h.FailCommits(t)
	t.Cleanup(restore)
	ids := publishN(t, pub, topic, 20, 4, 8)
	col.await(t, ids)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if !within(t, 15*time.Second, "Shutdown", func() { err = k.Shutdown(ctx) }) {
		return
	}
	if err == nil {
		t.Errorf("Shutdown returned nil though the server refused its commits")
	} else {
		t.Logf("Shutdown: %v", err)
	}
	awaitRun(t, done, hang)
	restore()
	// Not committed, so not lost: the group reads them again.
	again := newCollector()
	run(t, s.subscribe(t, s.open(t), topic, again.handler, append(earliest(sub), omnibus.Group("commit"))...))
	again.awaitWithin(t, 30*time.Second, ids)
}

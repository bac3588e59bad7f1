package transporttest

// Delivery and retries: retries and their attempt numbers, and the
// hostile cases: a key that keeps failing while the others flow,
// handlers slower than the ack deadline, and the byte bound on what is
// in flight. The tests run on the test's goroutine; handlers run on the
// consumer's workers and record into collectors (guarded by their mutex)
// and atomics.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

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
	RunConsumer(t, k)
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

// --- what one key does must not stall the others ---

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
	stop := RunConsumer(t, k)
	ids := publish(pub, topic)
	col.await(t, ids)
	stop()
	t.Logf("%d messages, %d handler calls (ack deadline %v, handler %v)", len(ids), calls.Load(), s.h.AckDeadline, slow)
	col.check(t, orderOf(pub), true)
}

// --- bounds ---

// testMaxInFlightBytes sends one small message, so the engine learns a
// small size, then large ones: the bytes in flight never pass the bound
// by more than one message. Large is 100 KiB against a bound of 1 MiB,
// or a quarter of the transport's MaxMessageBytes against ten of them
// where that is smaller.
func (s *suite) testMaxInFlightBytes(t *testing.T) {
	pub, sub := s.open(t), s.open(t)
	topic := s.topic(t, pub)
	bound, size := 1<<20, 100<<10
	if max := pub.Capabilities().MaxMessageBytes; max > 0 && max/4 < size {
		size = max / 4
		bound = 10 * size
	}
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
	stop := RunConsumer(t, k)
	col.await(t, publishN(t, pub, topic, 1, 1, 10))
	col.await(t, publishN(t, pub, topic, 200, 20, size))
	stop()
	if most := int64(bound/size + 1); peak.Load() > most {
		t.Errorf("%d messages of %d KiB in flight at once (%d KiB) with MaxInFlightBytes %d KiB; want at most %d (the bound and one message)",
			peak.Load(), size>>10, peak.Load()*int64(size)>>10, bound>>10, most)
	}
	col.check(t, orderOf(pub), false)
}

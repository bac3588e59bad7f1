package transporttest

// The fault suite: RunFaults and its tests, through real processes and
// real servers (a consumer killed mid-stream, the server restarted
// mid-stream, a rebalance storm, a handler that crashes its process), and
// the publisher they share, which runs on a goroutine of its own that the
// test waits for. Every test counts IDs: nothing may be lost; duplicates
// are counted and reported.

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// faultMessages is how many messages each fault test publishes.
const faultMessages = 20000

// faultKeys is how many keys they are spread over.
const faultKeys = 64

// RunFaults runs the fault tests against the transport that setup's
// harness opens. setup runs once, in the test's process only: a child
// process of the tests (a consumer the test kills) runs the same test
// binary and test, and RunFaults then runs the child instead, opening
// Harness.URL; setup must therefore be where the test starts its own
// servers. A transport adds the tests with one line:
//
//	func TestFaults(t *testing.T) { transporttest.RunFaults(t, harness) }
//
// Tests whose harness hook is missing (URL for child processes, Restart
// for a restart) are skipped, naming it.
func RunFaults(t *testing.T, setup func(t *testing.T) Harness) {
	if raw := os.Getenv(childEnv); raw != "" {
		runChild(raw) // never returns
	}
	h := setup(t)
	if h.Open == nil {
		t.Fatal("transporttest: Harness.Open is nil")
	}
	if h.Lanes == 0 {
		h.Lanes = 4
	}
	s := &faultSuite{suite: suite{h: h}, base: t.Name()}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c := h.Open(ctx, t)
	s.caps = c.Capabilities()
	_ = c.Close()
	cancel()
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"ConsumerKilled", s.testConsumerKilled},
		{"ServerRestart", s.testServerRestart},
		{"RebalanceStorm", s.testRebalanceStorm},
		{"PoisonCrashesItsProcess", s.testPoisonCrashes},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if gap := h.Gaps[tt.name]; gap != "" {
				t.Skip("SKIP (harness Gaps, a known defect): " + gap)
			}
			markGoroutines(t)
			tt.fn(t)
		})
	}
}

type faultSuite struct {
	suite
	base string // the test that called RunFaults: what children run
	caps omnibus.Capabilities
}

// needURL skips t when the harness gives no URL for child processes.
func (s *faultSuite) needURL(t *testing.T) {
	t.Helper()
	if s.h.URL == "" {
		t.Skip("SKIP (harness URL): the transport cannot be opened from another process (its state lives in this one)")
	}
}

// child starts a consumer process of group on topic.
func (s *faultSuite) child(t *testing.T, name, topic, group string, maxAttempts int, l *ledger) *child {
	t.Helper()
	spec := childSpec{URL: s.h.URL, Topic: topic, Group: group, MaxInFlight: 64, MaxAttempts: maxAttempts, Earliest: s.caps.Replay}
	c := startChild(t, s.base, name, spec, l)
	c.awaitReady(timeout)
	return c
}

// publisher opens the client fault tests publish with: one counting the
// publishes tried again, where the harness has a URL.
func (s *faultSuite) publisher(t *testing.T) (*omnibus.Client, *atomic.Int64) {
	t.Helper()
	retried := new(atomic.Int64)
	if s.h.URL == "" {
		return s.open(t), retried
	}
	c, err := omnibus.Open(ctxT(t), s.h.URL, omnibus.WithHooks(retryCount{retried}))
	if err != nil {
		t.Fatalf("Open(%q): %v", omnibus.RedactURL(s.h.URL), err)
	}
	t.Cleanup(func() { within(t, cleanupWait, "Client.Close", func() { _ = c.Close() }) })
	return c, retried
}

// retryCount counts the messages published again.
type retryCount struct{ n *atomic.Int64 }

func (r retryCount) OnPublishRetry(p omnibus.PublishRetry) { r.n.Add(int64(len(p.IDs))) }

// stream publishes messages on a goroutine of its own: n of them, keyed
// over faultKeys keys and numbered (headerSeq), in batches of 100, one
// batch every every (0: as fast as they go). A publish must ride through
// whatever the test does to the server: each has two minutes, and a
// failure fails the test.
type stream struct {
	mu        sync.Mutex
	ids       []string
	published atomic.Int64
	done      chan struct{}
}

func startStream(t *testing.T, c *omnibus.Client, topic string, n int, every time.Duration) *stream {
	st := &stream{done: make(chan struct{})}
	go func() {
		defer close(st.done)
		for i := 0; i < n; i += 100 {
			var ms []*omnibus.Message
			for j := i; j < min(n, i+100); j++ {
				ms = append(ms, &omnibus.Message{
					Key:     "key" + strconv.Itoa(j%faultKeys),
					Headers: map[string]string{headerSeq: strconv.FormatInt(seqs.Add(1), 10)},
					Body:    []byte("fault"),
				})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			err := c.Publish(ctx, topic, ms...)
			cancel()
			if err != nil {
				t.Errorf("Publish of messages %d-%d did not ride through: %v", i, i+len(ms)-1, err)
				return
			}
			st.mu.Lock()
			for _, m := range ms {
				st.ids = append(st.ids, m.ID)
			}
			st.mu.Unlock()
			st.published.Add(int64(len(ms)))
			if every > 0 {
				time.Sleep(every)
			}
		}
	}()
	t.Cleanup(func() { <-st.done })
	return st
}

// wait waits for the stream to end and returns the IDs published.
func (st *stream) wait(t *testing.T) []string {
	t.Helper()
	select {
	case <-st.done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("publishing did not end within 5 minutes: %d published", st.published.Load())
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ids
}

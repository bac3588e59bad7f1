package transporttest

// The suite: Run and its list of tests, and what every test uses:
// clients and topics that clean up after themselves, capability skips,
// polling (Eventually), running a consumer and stopping it within a
// bound, and reading members and lanes from Stats. Tests run one at a
// time, each on its test's goroutine; a consumer's Run runs on a
// goroutine the test starts (run, start) and ends.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
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
	if h.ResendsStoredTwice {
		storesTwice.Store(t.Name(), true)
	}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"RoundTrip", s.testRoundTrip},
		{"Bodies", s.testBodies},
		{"PublishErrors", s.testPublishErrors},
		{"Publisher", s.testPublisher},
		{"OrderPerLane", s.testOrderPerLane},
		{"OrderPerKey", s.testOrderPerKey},
		{"GroupSplitsAndTakesOver", s.testGroupTakeover},
		{"EveryGroupGetsEveryMessage", s.testGroups},
		{"Replay", s.testReplay},
		{"Retry", s.testRetry},
		{"DeadLetter", s.testDeadLetter},
		{"DeadLetterNamedTopic", s.testDeadLetterNamed},
		{"Lag", s.testLag},
		{"Age", s.testAge},
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
		{"IdleHandover", s.testIdleHandover},
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

// Open opens a client on url for a test, bounded by 30 seconds, and
// closes it at cleanup. A failure names the URL with its secrets
// redacted (omnibus.RedactURL), as test logs are logs too.
func Open(t testing.TB, url string) *omnibus.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, url)
	if err != nil {
		t.Fatalf("Open(%s): %v", omnibus.RedactURL(url), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RunConsumer starts k.Run and stops it at cleanup; it returns a stop
// function that shuts down gracefully, which may be called more than
// once. Run must then return nil within a minute: a drain that leaves
// messages unsettled, or a Run that does not end, fails the test.
func RunConsumer(t testing.TB, k *omnibus.Consumer) (stop func()) {
	t.Helper()
	return runUntil(t, k, false)
}

// runStuck is run for a test that leaves a message unsettled on purpose:
// the drain may end with an *UnsettledError.
func runStuck(t *testing.T, k *omnibus.Consumer) (stop func()) {
	t.Helper()
	return runUntil(t, k, true)
}

func runUntil(t testing.TB, k *omnibus.Consumer, stuck bool) (stop func()) {
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

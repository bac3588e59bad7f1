package nsqbus_test

import (
	"context"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// ackDeadline is the msg_timeout of the suite's clients: short, so that
// handlers outlast it, and long enough that a TOUCH or a FIN delayed by
// a machine running every package's tests under -race still comes in
// time (at 1s, one message in a few thousand timed out there).
const ackDeadline = 2 * time.Second

// harness opens clients on u. It declares no DeleteGroup: an NSQ
// channel is the group's state and holds its messages, as a RabbitMQ
// queue does, so the group's state cannot go without them; and no
// FailCommits: FIN cannot be refused from outside.
func harness(u string, restart func(ctx context.Context, t testing.TB)) transporttest.Harness {
	return transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			c, err := omnibus.Open(ctx, u)
			if err != nil {
				t.Fatalf("Open(%s): %v", omnibus.RedactURL(u), err)
			}
			return c
		},
		Lanes:       1,
		AckDeadline: ackDeadline,
		Restart:     restart,
	}
}

// restartShared stops the shared nsqd gracefully and starts it again on
// its data directory.
func restartShared(ctx context.Context, t testing.TB) {
	n, _ := cluster(t)
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatalf("start nsqd again: %v", err)
	}
}

func TestConformance(t *testing.T) {
	deleteSuiteTopics(t)
	msgTimeout := "msg_timeout=" + ackDeadline.String()
	t.Run("direct", func(t *testing.T) {
		transporttest.Run(t, harness(directURL(t, msgTimeout), restartShared))
	})
	t.Run("lookup", func(t *testing.T) {
		transporttest.Run(t, harness(lookupURL(t, msgTimeout), restartShared))
	})
	t.Run("binary", func(t *testing.T) { // the binary envelope
		transporttest.Run(t, harness(directURL(t, msgTimeout, "envelope=binary"), restartShared))
	})
}

// TestFaults runs the fault suite on an nsqd of the test's own, which
// the restart test stops gracefully (nsqd writes what it holds, in
// flight included, to its data directory) and starts again on its data.
// A killed consumer's messages are in flight until msg_timeout, then
// delivered to the others.
func TestFaults(t *testing.T) {
	transporttest.RunFaults(t, func(t *testing.T) transporttest.Harness {
		srv := nsqtest.StartNSQD(t, nsqtest.Config{})
		u := srv.URL(testParams, "msg_timeout="+ackDeadline.String())
		h := harness(u, func(ctx context.Context, t testing.TB) {
			srv.Stop()
			if err := srv.Start(); err != nil {
				t.Fatalf("start nsqd again: %v", err)
			}
		})
		h.URL = u
		h.Gaps = map[string]string{"PoisonCrashesItsProcess": poisonGap}
		return h
	})
}

// poisonGap is why nsqbus cannot yet dead-letter a message that crashes
// its holders without taking innocent ones along (see the package
// documentation, Delivery semantics).
const poisonGap = "FIN has no answer in NSQ's protocol, and go-nsq writes it from the connection's own goroutine after Finish returned, " +
	"so a member cannot make sure that what it settled reached nsqd before a suspect runs: a process the poisoned message crashes " +
	"can take with it the FINs of messages handled just before, which come back with nsqd's attempt count raised at each crash; " +
	"one that reaches MaxAttempts is dead-lettered although it never crashed anything (1 or 2 of 39 in the fault test)"

package nsqbus_test

import (
	"context"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
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
				t.Fatalf("Open(%q): %v", u, err)
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
}

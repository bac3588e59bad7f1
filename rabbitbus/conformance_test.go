package rabbitbus

import (
	"context"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/rabbitnode"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestConformance runs the suite in both modes. The harnesses declare no
// AckDeadline (the server's consumer_timeout is far beyond a test), no
// DeleteGroup (a group's state is its queue, which holds its messages)
// and no FailCommits (acknowledgements cannot be refused from outside).
func TestConformance(t *testing.T) {
	requireServer(t)
	t.Run("default", func(t *testing.T) {
		transporttest.Run(t, transporttest.Harness{
			Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
				return open(ctx, t, "")
			},
			Restart: restart,
		})
	})
	t.Run("partitioned", func(t *testing.T) {
		transporttest.Run(t, transporttest.Harness{
			Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
				return open(ctx, t, "partitions=4&rebalance=500ms")
			},
			Lanes: 4,
		})
	})
}

// TestFaults runs the fault suite on a RabbitMQ node of the test's own
// (the server other tests share is never restarted), with quorum queues,
// whose x-delivery-count carries a message's attempts across consumers.
// A classic queue says only that a message was delivered before (see the
// package documentation).
func TestFaults(t *testing.T) {
	transporttest.RunFaults(t, faultHarness("queue_type=quorum"))
}

// TestFaultsPartitioned is TestFaults in partitioned mode.
func TestFaultsPartitioned(t *testing.T) {
	transporttest.RunFaults(t, faultHarness("queue_type=quorum&partitions=4&rebalance=500ms"))
}

func faultHarness(params string) func(t *testing.T) transporttest.Harness {
	return func(t *testing.T) transporttest.Harness {
		node := rabbitnode.Start(t)
		url := node.URL(params)
		return transporttest.Harness{
			Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
				c, err := omnibus.Open(ctx, url)
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				return c
			},
			URL:     url,
			Lanes:   4,
			Restart: func(ctx context.Context, t testing.TB) { node.Restart() },
		}
	}
}

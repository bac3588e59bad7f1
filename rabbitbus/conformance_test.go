package rabbitbus

import (
	"context"
	"testing"

	"github.com/omnibus-go/omnibus"
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

package rabbitbus

import (
	"context"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

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

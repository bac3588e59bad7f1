package kafkabus_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

func TestConformance(t *testing.T) {
	// The broker and the client both allow 2 MiB, so the suite's 1 MiB
	// body runs; Kafka's default (1048588) would skip it.
	c := newCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "2097152"}))
	url := clusterURL(c, "max_message_bytes=2097152&fetch_max_partition_bytes=2097152")
	transporttest.Run(t, transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			cl, err := omnibus.Open(ctx, url)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return cl
		},
		Lanes: 4,
	})
}

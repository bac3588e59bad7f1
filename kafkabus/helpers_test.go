package kafkabus_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	_ "github.com/omnibus-go/omnibus/kafkabus"
)

// testParams make group membership react in test time: members notice a
// rebalance within 100ms instead of 3s, and a fetch waits at most 100ms.
const testParams = "heartbeat_interval=100ms&session_timeout=10s&rebalance_timeout=20s&fetch_max_wait=100ms&metadata_max_age=1s"

// newCluster starts an in-process Kafka of three brokers, closed at
// cleanup.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(3)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// clusterURL is the kafka:// URL of c with the test parameters and extra
// ones ("a=b&c=d").
func clusterURL(c *kfake.Cluster, extra string) string {
	u := "kafka://" + strings.Join(c.ListenAddrs(), ",") + "?" + testParams
	if extra != "" {
		u += "&" + extra
	}
	return u
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

package natsbus_test

import (
	"context"
	"strings"
	"testing"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// harness opens clients on rawURL.
func harness(rawURL string, lanes int) transporttest.Harness {
	return transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			c, err := omnibus.Open(ctx, rawURL)
			if err != nil {
				t.Fatalf("Open(%q): %v", rawURL, err)
			}
			return c
		},
		Lanes: lanes,
	}
}

// cleanupSuiteStreams deletes the streams the suite created under t on
// the external server, and their groups' lease buckets.
func cleanupSuiteStreams(t *testing.T, serverURL string) {
	// The suite keeps the last 60 characters of a long test name: match
	// on the test's name without its "Test" prefix, anywhere.
	name := strings.ToLower(topicRE.ReplaceAllString(strings.TrimPrefix(t.Name(), "Test"), "-"))
	t.Cleanup(func() {
		// The topics' streams, and the lease buckets of their groups.
		deleteStreamsWhere(t, serverURL, func(n string) bool {
			l := strings.ToLower(n)
			return (strings.HasPrefix(l, "omnibus-") || strings.HasPrefix(l, "kv_omnibus-")) && strings.Contains(l, name+"-")
		})
	})
}

func TestConformanceExternal(t *testing.T) {
	u := externalURL(t)
	cleanupSuiteStreams(t, u)
	transporttest.Run(t, harness(u+"?ack_wait=5s", 1))
}

func TestConformanceEmbedded(t *testing.T) {
	// The server starts with a test's first client and stops with its
	// last; the data directory keeps the streams in between.
	dir := t.TempDir()
	transporttest.Run(t, harness("nats://embedded?ack_wait=5s&dir="+dir, 1))
}

// partitionedParams make the partitioned mode's leases react in test time.
const partitionedParams = "partitions=4&lease_ttl=2s&rebalance_interval=100ms"

func TestConformancePartitionedExternal(t *testing.T) {
	u := externalURL(t)
	cleanupSuiteStreams(t, u)
	transporttest.Run(t, harness(u+"?ack_wait=5s&"+partitionedParams, 4))
}

func TestConformancePartitionedEmbedded(t *testing.T) {
	dir := t.TempDir()
	transporttest.Run(t, harness("nats://embedded?ack_wait=5s&"+partitionedParams+"&dir="+dir, 4))
}

package natsbus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// harness opens clients on rawURL, which sets ackParam.
func harness(rawURL string, lanes int) transporttest.Harness {
	return transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			c, err := omnibus.Open(ctx, rawURL)
			if err != nil {
				t.Fatalf("Open(%q): %v", rawURL, err)
			}
			return c
		},
		Lanes:       lanes,
		AckDeadline: ackWait,
		DeleteGroup: func(ctx context.Context, t testing.TB, topic, group string) {
			deleteGroup(ctx, t, rawURL, topic, group)
		},
	}
}

// ackWait is the ack_wait of the suite's URLs (ackParam): short, so that
// handlers and queues outlast it.
const ackWait = time.Second

var ackParam = "ack_wait=" + ackWait.String()

// deleteGroup deletes the durable consumers of group on topic's stream,
// the group's one consumer or each of its partition consumers, on a
// connection of its own to the server at rawURL.
func deleteGroup(ctx context.Context, t testing.TB, rawURL, topic, group string) {
	t.Helper()
	dc, nc, err := natsbus.OpenConn(ctx, rawURL)
	if err != nil {
		t.Fatalf("OpenConn: %v", err)
	}
	defer dc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	// The topic's subject, or its partitions' subjects.
	name, err := js.StreamNameBySubject(ctx, topic)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		name, err = js.StreamNameBySubject(ctx, topic+".>")
	}
	if err != nil {
		t.Fatalf("stream of %q: %v", topic, err)
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %q: %v", name, err)
	}
	var names []string
	consumers := stream.ConsumerNames(ctx)
	for c := range consumers.Name() {
		if c == group || strings.HasPrefix(c, group+"_p") {
			names = append(names, c)
		}
	}
	if err := consumers.Err(); err != nil {
		t.Fatalf("consumers of stream %q: %v", name, err)
	}
	if len(names) == 0 {
		t.Fatalf("stream %q has no consumer of group %q", name, group)
	}
	for _, c := range names {
		// A 2.9 server can fail a delete while the consumer's directory is
		// still being written ("directory not empty"): try again.
		var err error
		for try := 0; try < 20; try++ {
			if err = stream.DeleteConsumer(ctx, c); err == nil || errors.Is(err, jetstream.ErrConsumerNotFound) {
				err = nil
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("delete consumer %q of stream %q: %v", c, name, err)
		}
	}
	t.Logf("deleted consumers %v of stream %q", names, name)
}

// cleanupSuiteStreams deletes, at the end of t, the streams the suite
// created on the external server in this process (their names start with
// the suite's prefix), and its groups' buckets.
func cleanupSuiteStreams(t *testing.T, serverURL string) {
	prefix := strings.ToLower(transporttest.TopicPrefix())
	t.Cleanup(func() {
		deleteStreamsWhere(t, serverURL, func(n string) bool {
			l := strings.ToLower(n)
			return strings.HasPrefix(l, prefix) || strings.HasPrefix(l, "kv_"+prefix)
		})
	})
}

func TestConformanceExternal(t *testing.T) {
	u := externalURL(t)
	cleanupSuiteStreams(t, u)
	transporttest.Run(t, harness(u+"?"+ackParam, 1))
}

func TestConformanceEmbedded(t *testing.T) {
	// The server starts with a test's first client and stops with its
	// last; the data directory keeps the streams in between.
	dir := t.TempDir()
	transporttest.Run(t, harness("nats://embedded?"+ackParam+"&dir="+dir, 1))
}

// partitionedParams make the partitioned mode's leases react in test time.
const partitionedParams = "partitions=4&lease_ttl=2s&rebalance_interval=100ms"

func TestConformancePartitionedExternal(t *testing.T) {
	u := externalURL(t)
	cleanupSuiteStreams(t, u)
	transporttest.Run(t, harness(u+"?"+ackParam+"&"+partitionedParams, 4))
}

func TestConformancePartitionedEmbedded(t *testing.T) {
	dir := t.TempDir()
	transporttest.Run(t, harness("nats://embedded?"+ackParam+"&"+partitionedParams+"&dir="+dir, 4))
}

// TestFaults runs the fault suite on a nats-server process of the test's
// own, which the restart test stops and starts again with its store.
func TestFaults(t *testing.T) {
	transporttest.RunFaults(t, faultHarness(""))
}

// TestFaultsPartitioned is TestFaults in partitioned mode.
func TestFaultsPartitioned(t *testing.T) {
	transporttest.RunFaults(t, faultHarness(partitionedParams))
}

func faultHarness(params string) func(t *testing.T) transporttest.Harness {
	return func(t *testing.T) transporttest.Harness {
		srv := startPrivateServer(t)
		u := srv.url() + "?" + ackParam + "&reconnect_wait=100ms"
		lanes := 1
		if params != "" {
			u += "&" + params
			lanes = 4
		}
		h := harness(u, lanes)
		h.URL = u
		h.Restart = func(ctx context.Context, t testing.TB) {
			srv.stop()
			srv.start()
		}
		return h
	}
}

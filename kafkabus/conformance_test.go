package kafkabus_test

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

func TestConformance(t *testing.T) {
	// The broker and the client both allow 2 MiB, so the suite's 1 MiB
	// body runs; Kafka's default (1048588) would skip it. The cluster
	// keeps its data on disk, so Restart brings back topics and offsets on
	// the same ports. Kafka has no ack deadline (AckDeadline), and a
	// group's state is nothing but its committed offsets (DeleteGroup).
	rc := newRestartableCluster(t, kfake.BrokerConfigs(map[string]string{"message.max.bytes": "2097152"}))
	url := clusterURL(rc.current(), "max_message_bytes=2097152&fetch_max_partition_bytes=2097152")
	transporttest.Run(t, transporttest.Harness{
		Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
			cl, err := omnibus.Open(ctx, url)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return cl
		},
		Lanes:       4,
		Restart:     func(ctx context.Context, t testing.TB) { rc.restart(t) },
		FailCommits: func(t testing.TB) func() { return rc.failCommits() },
	})
}

// restartableCluster is a kfake cluster that can be stopped and started
// again on the same ports with the same data.
type restartableCluster struct {
	opts []kfake.Opt
	mu   sync.Mutex
	c    *kfake.Cluster
}

func newRestartableCluster(t testing.TB, opts ...kfake.Opt) *restartableCluster {
	t.Helper()
	var ports []int
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		_ = ln.Close()
	}
	rc := &restartableCluster{opts: append([]kfake.Opt{kfake.NumBrokers(3), kfake.Ports(ports...), kfake.DataDir(t.TempDir())}, opts...)}
	rc.start(t)
	t.Cleanup(func() {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.c.Close()
	})
	return rc
}

func (rc *restartableCluster) start(t testing.TB) {
	t.Helper()
	c, err := kfake.NewCluster(rc.opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	rc.mu.Lock()
	rc.c = c
	rc.mu.Unlock()
}

func (rc *restartableCluster) current() *kfake.Cluster {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.c
}

// failCommits makes the cluster refuse every offset commit, each
// partition with an error, until the returned function is called.
func (rc *restartableCluster) failCommits() (restore func()) {
	var off atomic.Bool
	c := rc.current()
	c.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if off.Load() {
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		commit := req.(*kmsg.OffsetCommitRequest)
		resp := commit.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range commit.Topics {
			topic := kmsg.NewOffsetCommitResponseTopic()
			topic.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				p := kmsg.NewOffsetCommitResponseTopicPartition()
				p.Partition, p.ErrorCode = rp.Partition, kerr.OffsetMetadataTooLarge.Code
				topic.Partitions = append(topic.Partitions, p)
			}
			resp.Topics = append(resp.Topics, topic)
		}
		return resp, nil, true
	})
	return func() { off.Store(true) }
}

func (rc *restartableCluster) restart(t testing.TB) {
	t.Helper()
	rc.current().Close()
	rc.start(t)
	t.Logf("kfake restarted on %s", strconv.Quote(rc.current().ListenAddrs()[0]))
}

// TestFaults runs the fault suite on a cluster of its own, which the
// restart test closes and starts again on the same ports and data. A
// killed member's partitions move once its session (3s here) expires.
func TestFaults(t *testing.T) {
	transporttest.RunFaults(t, func(t *testing.T) transporttest.Harness {
		rc := newRestartableCluster(t)
		url := clusterURL(rc.current(), "session_timeout=3s")
		return transporttest.Harness{
			Open: func(ctx context.Context, t testing.TB) *omnibus.Client {
				return transporttest.Open(t, url)
			},
			URL:     url,
			Lanes:   4,
			Restart: func(ctx context.Context, t testing.TB) { rc.restart(t) },
		}
	})
}

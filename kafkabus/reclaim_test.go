package kafkabus_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestReclaimNotCounted: a member handling the first record of each of
// two partitions loses one of them (a second member joins: the
// cooperative-sticky balancer moves one partition to it) and gets it back
// (the second member leaves without running anything) while alive. It
// did not crash on that record, so the record's next run is not counted
// as another holder's (attempt 1, not 2) and the lane is not guarded.
func TestReclaimNotCounted(t *testing.T) {
	const topic, group = "reclaim", "reclaim"
	cluster := newCluster(t, kfake.SeedTopics(2, topic))
	logs := &testenv.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, clusterURL(cluster, ""), omnibus.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	raw, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for p := range int32(2) {
		if err := raw.ProduceSync(ctxT(t), &kgo.Record{Topic: topic, Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	attempts := map[string][]int{} // lane -> the attempts of its record's runs
	running := make(chan string, 2)
	release := make(chan struct{})
	defer close(release)
	k, err := c.Subscribe(ctxT(t), topic, func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		attempts[m.Lane] = append(attempts[m.Lane], m.Attempt)
		first := len(attempts[m.Lane]) == 1
		mu.Unlock()
		if !first {
			return nil
		}
		running <- m.Lane
		select {
		case <-ctx.Done(): // the partition is lost
			return ctx.Err()
		case <-release: // the test ends
			return nil
		}
	}, omnibus.Group(group), omnibus.StartFrom(omnibus.StartEarliest), omnibus.DrainTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	for range 2 {
		select {
		case <-running:
		case <-time.After(30 * time.Second):
			t.Fatal("the records were not handled")
		}
	}

	// A second member, which runs nothing and commits nothing, takes one
	// partition and leaves.
	got := make(chan []int32, 4)
	other, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.DisableAutoCommit(),
		kgo.HeartbeatInterval(100*time.Millisecond),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			if len(a[topic]) > 0 {
				got <- a[topic]
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ps := <-got:
		t.Logf("the second member took partitions %v", ps)
	case <-time.After(30 * time.Second):
		other.Close()
		t.Fatal("the second member was assigned nothing")
	}
	other.Close() // leaves the group

	var lane string
	transporttest.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for l, as := range attempts {
			if len(as) >= 2 {
				lane = l
				return true
			}
		}
		return false
	}, func() string { return "no record ran again after its partition came back" })
	mu.Lock()
	as := attempts[lane]
	mu.Unlock()
	t.Logf("lane %s: attempts %v", lane, as)
	if as[1] != 1 {
		t.Errorf("lane %s: attempts %v: the member's own earlier run was counted as another holder's", lane, as)
	}
	if strings.Contains(logs.String(), "a previous holder began") {
		t.Errorf("the lane was guarded:\n%s", logs.String())
	}
}

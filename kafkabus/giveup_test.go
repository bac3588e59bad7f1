package kafkabus_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// brokerFault is what a faulty broker does with a produce request.
type brokerFault int

const (
	faultNone    brokerFault = iota
	faultRefuse              // answers NOT_ENOUGH_REPLICAS (retriable) for every partition
	faultClose               // closes the connection
	faultSilence             // never answers
)

// produceFaults makes the broker that leads partition 0 of topic on
// cluster do what fault holds with each produce request; the other
// partition (1) is moved to another broker, which answers as usual.
// It returns how many produce requests the faulty broker refused.
func produceFaults(t *testing.T, cluster *kfake.Cluster, topic string, fault *atomic.Int32) *atomic.Int32 {
	t.Helper()
	bad := cluster.LeaderFor(topic, 0)
	if cluster.LeaderFor(topic, 1) == bad {
		if err := cluster.MoveTopicPartition(topic, 1, (bad+1)%3); err != nil {
			t.Fatal(err)
		}
	}
	var hit atomic.Int32
	cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		f := brokerFault(fault.Load())
		if f == faultNone || cluster.CurrentNode() != bad {
			return nil, nil, false
		}
		hit.Add(1)
		switch f {
		case faultClose:
			return nil, errors.New("closed by the test"), true
		case faultSilence:
			return nil, nil, true
		}
		pr := req.(*kmsg.ProduceRequest)
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return &hit
}

// keysOf returns n keys that franz-go's producer (murmur2, as kafkabus
// configures it) sends to partition p of a topic of two.
func keysOf(p int32, n int) []string {
	part := kgo.StickyKeyPartitioner(nil).ForTopic("any")
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		if part.Partition(&kgo.Record{Key: []byte(k)}, 2) == int(p) {
			keys = append(keys, k)
		}
	}
	return keys
}

// countRecords reads topic from the start on a client of its own until
// it has seen the high watermarks, and returns how many records carry
// each ce_id.
func countRecords(t *testing.T, cluster *kfake.Cluster, topic string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for id, rs := range readRecords(t, cluster, topic) {
		got[id] = len(rs)
	}
	return got
}

// readRecords reads topic from the start on a client of its own until
// it has seen the high watermarks, and returns the records by ce_id.
func readRecords(t *testing.T, cluster *kfake.Cluster, topic string) map[string][]*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadmEnds(ctx, t, cl, topic)
	got := map[string][]*kgo.Record{}
	seen := map[int32]int64{}
	done := func() bool {
		for p, end := range adm {
			if seen[p] < end {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %q back: %v (read up to %v of %v)", topic, ctx.Err(), seen, adm)
		}
		fs.EachRecord(func(r *kgo.Record) {
			seen[r.Partition] = r.Offset + 1
			for _, h := range r.Headers {
				if h.Key == "ce_id" {
					got[string(h.Value)] = append(got[string(h.Value)], r)
				}
			}
		})
	}
	return got
}

// kadmEnds returns the high watermark of each partition of topic.
func kadmEnds(ctx context.Context, t *testing.T, cl *kgo.Client, topic string) map[int32]int64 {
	t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(2) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	ends := map[int32]int64{}
	for _, shard := range cl.RequestSharded(ctx, req) {
		if shard.Err != nil {
			t.Fatalf("list offsets: %v", shard.Err)
		}
		for _, st := range shard.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, sp := range st.Partitions {
				if err := kerr.ErrorForCode(sp.ErrorCode); err != nil {
					t.Fatalf("list offsets of partition %d: %v", sp.Partition, err)
				}
				ends[sp.Partition] = sp.Offset
			}
		}
	}
	return ends
}

// TestPublisherGivenUp: a Publisher on Kafka hands its batches to
// franz-go's producer, which gives up on the records of a partition
// whose broker refuses them, drops the connection, or says nothing past
// the delivery timeout. Each such message's result fails with an error
// wrapping ErrOutcomeUnknown, Flush returns, the other partition's
// messages land, and once the broker answers again, no message given up
// on appears in the topic (omnibus does not produce it again), and none
// appears twice.
func TestPublisherGivenUp(t *testing.T) {
	for _, tt := range []struct {
		name  string
		fault brokerFault
	}{
		{"refused", faultRefuse},
		{"closed", faultClose},
		{"silent", faultSilence},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.fault == faultSilence && testing.Short() {
				// franz-go waits for an answer request_timeout and
				// its overhead of 10s before it drops the connection.
				t.Skip("a silent broker takes 11 s")
			}
			const topic = "given-up"
			cluster := newCluster(t, kfake.SeedTopics(2, topic))
			var fault atomic.Int32
			hits := produceFaults(t, cluster, topic, &fault)
			c := transporttest.Open(t, clusterURL(cluster, "delivery_timeout=1s&request_timeout=1s"))
			if err := c.Publish(ctxT(t), topic, &omnibus.Message{Key: keysOf(0, 1)[0], Body: []byte("warm")}, &omnibus.Message{Key: keysOf(1, 1)[0], Body: []byte("warm")}); err != nil {
				t.Fatalf("Publish before the fault: %v", err)
			}
			p, err := c.Publisher(omnibus.BatchSize(5, 1<<20))
			if err != nil {
				t.Fatal(err)
			}
			fault.Store(int32(tt.fault))
			const n = 40
			bad, good := keysOf(0, n/2), keysOf(1, n/2)
			type sent struct {
				r   *omnibus.PublishResult
				bad bool
			}
			var rs []sent
			start := time.Now()
			for i := range n {
				k, isBad := good[i/2], false
				if i%2 == 0 {
					k, isBad = bad[i/2], true
				}
				r, err := p.Publish(ctxT(t), topic, &omnibus.Message{Key: k, Body: []byte(fmt.Sprint(i))})
				if err != nil {
					t.Fatalf("Publish %d: %v", i, err)
				}
				rs = append(rs, sent{r, isBad})
			}
			fctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.Flush(fctx); err != nil {
				t.Fatalf("Flush: %v after %v", err, time.Since(start))
			}
			t.Logf("Flush returned after %v; the faulty broker saw %d produce requests", time.Since(start).Round(time.Millisecond), hits.Load())
			if hits.Load() == 0 {
				t.Fatal("the faulty broker saw no produce request")
			}
			failed := map[string]bool{}
			for i, s := range rs {
				err := s.r.Err()
				switch {
				case s.bad && err == nil:
					t.Errorf("message %d (partition 0) landed", i)
				case s.bad && !errors.Is(err, omnibus.ErrOutcomeUnknown):
					t.Errorf("message %d (partition 0): %v, want an error wrapping ErrOutcomeUnknown", i, err)
				case !s.bad && err != nil:
					t.Errorf("message %d (partition 1): %v", i, err)
				}
				if err != nil {
					failed[s.r.ID()] = true
				}
				if i == 0 {
					t.Logf("message 0: %v", err)
				}
			}
			if err := p.Close(fctx); err != nil {
				t.Errorf("Close: %v", err)
			}
			fault.Store(int32(faultNone))
			// Produce after the fault, so that anything produced again
			// would be in the topic before these.
			if err := c.Publish(ctxT(t), topic, &omnibus.Message{Key: bad[0], Body: []byte("after")}, &omnibus.Message{Key: good[0], Body: []byte("after")}); err != nil {
				t.Fatalf("Publish after the fault: %v", err)
			}
			time.Sleep(500 * time.Millisecond) // room for a produce again to show
			counts := countRecords(t, cluster, topic)
			for _, s := range rs {
				id := s.r.ID()
				switch want := map[bool]int{false: 1, true: 0}[failed[id]]; {
				case counts[id] != want:
					t.Errorf("message %s (failed: %v) is in the topic %d times, want %d", id, failed[id], counts[id], want)
				}
			}
		})
	}
}

// TestPublisherCloseWhileSilent: Close with a context that ends while
// batches are inside franz-go's producer, on a broker that has stopped
// answering, returns by the context's deadline (and a little), the
// pending messages fail of unknown outcome, and no goroutine of the Publisher outlives it.
func TestPublisherCloseWhileSilent(t *testing.T) {
	const topic = "close-silent"
	cluster := newCluster(t, kfake.SeedTopics(2, topic))
	var fault atomic.Int32
	produceFaults(t, cluster, topic, &fault)
	c := transporttest.Open(t, clusterURL(cluster, ""))
	if err := c.Publish(ctxT(t), topic, &omnibus.Message{Key: keysOf(0, 1)[0], Body: []byte("warm")}, &omnibus.Message{Key: keysOf(1, 1)[0], Body: []byte("warm")}); err != nil {
		t.Fatalf("Publish before the fault: %v", err)
	}
	before := ours()
	p, err := c.Publisher(omnibus.BatchSize(5, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	fault.Store(int32(faultSilence))
	var rs []*omnibus.PublishResult
	for i, k := range keysOf(0, 20) {
		r, err := p.Publish(ctxT(t), topic, &omnibus.Message{Key: k, Body: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
		rs = append(rs, r)
	}
	time.Sleep(200 * time.Millisecond) // the batches are in franz-go's producer
	const wait = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	err = p.Close(ctx)
	took := time.Since(start)
	t.Logf("Close: %v after %v", err, took.Round(time.Millisecond))
	if took > wait+500*time.Millisecond {
		t.Errorf("Close took %v with a context of %v", took, wait)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close: %v, want the context's error", err)
	}
	for i, r := range rs {
		select {
		case <-r.Ready():
			// In flight to a broker that may have written them.
			if !errors.Is(r.Err(), omnibus.ErrOutcomeUnknown) {
				t.Errorf("message %d: %v, want an error wrapping ErrOutcomeUnknown", i, r.Err())
			}
			if i == 0 {
				t.Logf("message 0: %v", r.Err())
			}
		default:
			t.Errorf("message %d has no outcome after Close", i)
		}
	}
	fault.Store(int32(faultNone))
	deadline := time.Now().Add(5 * time.Second)
	for len(ours()) > len(before) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if now := ours(); len(now) > len(before) {
		t.Errorf("%d goroutines of omnibus or kafkabus before the Publisher, %d after Close:\n%s", len(before), len(now), strings.Join(now, "\n\n"))
	}
}

// ours returns the stacks of the goroutines, other than the caller's,
// running code of package omnibus or kafkabus (franz-go's and kfake's
// own goroutines, which come and go with their connections, are not
// counted).
func ours() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i > 0 && (strings.Contains(g, "github.com/omnibus-go/omnibus.") || strings.Contains(g, "github.com/omnibus-go/omnibus/kafkabus.")) {
			found = append(found, g)
		}
	}
	return found
}

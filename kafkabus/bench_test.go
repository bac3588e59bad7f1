package kafkabus_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/kafkabus"
)

// The benchmarks compare omnibus with raw franz-go doing the same work on
// the same in-process cluster, in the same run: batches of 100 records
// with a key, the body and the same CloudEvents headers, acks=all and the
// idempotent producer; consuming in a group from the earliest offset,
// counting every record and committing asynchronously.

var (
	benchOnce    sync.Once
	benchCluster *kfake.Cluster
	benchTopicN  atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchCluster != nil {
		benchCluster.Close()
	}
	os.Exit(code)
}

func benchKafka(b *testing.B) *kfake.Cluster {
	benchOnce.Do(func() {
		c, err := kfake.NewCluster(kfake.NumBrokers(3))
		if err != nil {
			b.Fatalf("kfake: %v", err)
		}
		benchCluster = c
	})
	return benchCluster
}

func benchTopic(b *testing.B, c *omnibus.Client) string {
	topic := "bench-" + strconv.FormatInt(benchTopicN.Add(1), 10)
	if err := c.CreateTopic(context.Background(), topic, 4); err != nil {
		b.Fatalf("CreateTopic: %v", err)
	}
	return topic
}

var benchSizes = []struct {
	name string
	size int
}{{"100B", 100}, {"1KiB", 1024}}

const benchBatch = 100

// rawRecords builds what omnibus puts on the wire for n messages.
func rawRecords(topic string, n int, body []byte, seq *int) []*kgo.Record {
	rs := make([]*kgo.Record, n)
	for i := range rs {
		*seq++
		now := time.Now().UTC()
		rs[i] = &kgo.Record{
			Topic: topic,
			Key:   []byte("key-" + strconv.Itoa(*seq%64)),
			Value: body,
			Headers: []kgo.RecordHeader{
				{Key: "ce_specversion", Value: []byte("1.0")},
				{Key: "ce_id", Value: []byte("raw-" + strconv.Itoa(*seq))},
				{Key: "ce_type", Value: []byte("bench.event")},
				{Key: "ce_time", Value: now.AppendFormat(nil, time.RFC3339Nano)},
			},
		}
	}
	return rs
}

func rawProducer(b *testing.B, cluster *kfake.Cluster) *kgo.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	return cl
}

func omnibusMessages(n int, body []byte, seq *int) []*omnibus.Message {
	ms := make([]*omnibus.Message, n)
	for i := range ms {
		*seq++
		ms[i] = &omnibus.Message{Key: "key-" + strconv.Itoa(*seq%64), Type: "bench.event", Body: body}
	}
	return ms
}

func reportRate(b *testing.B, n int, rates map[string]float64, name string) {
	rate := float64(n) / b.Elapsed().Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(0, "ns/op")
	rates[name] = rate // the last (largest) run of a sub-benchmark wins
}

func logRatios(b *testing.B, what string, rates map[string]float64) {
	for _, s := range benchSizes {
		o, r := rates["omnibus/"+s.name], rates["franz-go/"+s.name]
		if d := rates["driver/"+s.name]; d > 0 && r > 0 {
			fmt.Printf("%s %s: kafkabus driver alone (no engine) %.0f msgs/s, %.1f%% of raw\n", what, s.name, d, 100*d/r)
		}
		if o > 0 && r > 0 {
			fmt.Printf("%s %s: omnibus %.0f msgs/s, raw franz-go %.0f msgs/s, omnibus/raw %.1f%%\n", what, s.name, o, r, 100*o/r)
		}
		if o, r := rates["omnibus-async/"+s.name], rates["franz-go-async/"+s.name]; o > 0 && r > 0 {
			fmt.Printf("%s %s async: omnibus Publisher %.0f msgs/s, raw franz-go Produce %.0f msgs/s, omnibus/raw %.1f%%\n", what, s.name, o, r, 100*o/r)
		}
	}
}

func BenchmarkPublish(b *testing.B) {
	cluster := benchKafka(b)
	rates := map[string]float64{}
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		b.Run("omnibus/"+s.name, func(b *testing.B) {
			c := open(b, "kafka://"+cluster.ListenAddrs()[0]+"?durability=all")
			topic := benchTopic(b, c)
			seq := 0
			_ = c.Publish(context.Background(), topic, omnibusMessages(1, body, &seq)...) // warm up the producer
			b.ResetTimer()
			for i := 0; i < b.N; i += benchBatch {
				if err := c.Publish(context.Background(), topic, omnibusMessages(min(benchBatch, b.N-i), body, &seq)...); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportRate(b, b.N, rates, "omnibus/"+s.name)
		})
		b.Run("franz-go/"+s.name, func(b *testing.B) {
			c := open(b, "kafka://"+cluster.ListenAddrs()[0])
			topic := benchTopic(b, c)
			cl := rawProducer(b, cluster)
			seq := 0
			_ = cl.ProduceSync(context.Background(), rawRecords(topic, 1, body, &seq)...).FirstErr()
			b.ResetTimer()
			for i := 0; i < b.N; i += benchBatch {
				if err := cl.ProduceSync(context.Background(), rawRecords(topic, min(benchBatch, b.N-i), body, &seq)...).FirstErr(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportRate(b, b.N, rates, "franz-go/"+s.name)
		})
		b.Run("omnibus-async/"+s.name, func(b *testing.B) {
			c := open(b, "kafka://"+cluster.ListenAddrs()[0]+"?durability=all")
			topic := benchTopic(b, c)
			p, err := c.Publisher()
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			seq := 0
			_ = c.Publish(context.Background(), topic, omnibusMessages(1, body, &seq)...) // warm up the producer
			ms := omnibusMessages(b.N, body, &seq)
			results := make([]*omnibus.PublishResult, len(ms))
			b.ResetTimer()
			for i, m := range ms {
				if results[i], err = p.Publish(context.Background(), topic, m); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			for _, r := range results {
				if err := r.Err(); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b, b.N, rates, "omnibus-async/"+s.name)
		})
		b.Run("franz-go-async/"+s.name, func(b *testing.B) {
			c := open(b, "kafka://"+cluster.ListenAddrs()[0])
			topic := benchTopic(b, c)
			cl := rawProducer(b, cluster)
			seq := 0
			_ = cl.ProduceSync(context.Background(), rawRecords(topic, 1, body, &seq)...).FirstErr()
			var failed atomic.Int64
			b.ResetTimer()
			// Records are built as they are produced, headers included,
			// as omnibus's side builds them.
			for range b.N {
				r := rawRecords(topic, 1, body, &seq)[0]
				cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
					if err != nil {
						failed.Add(1)
					}
				})
			}
			if err := cl.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d failed", n)
			}
			reportRate(b, b.N, rates, "franz-go-async/"+s.name)
		})
	}
	logRatios(b, "publish", rates)
}

// fill publishes n records of size to a new topic, untimed.
func fill(b *testing.B, cluster *kfake.Cluster, c *omnibus.Client, n int, body []byte) string {
	b.Helper()
	topic := benchTopic(b, c)
	cl := rawProducer(b, cluster)
	seq := 0
	for i := 0; i < n; i += 1000 {
		if err := cl.ProduceSync(context.Background(), rawRecords(topic, min(1000, n-i), body, &seq)...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	return topic
}

func BenchmarkConsume(b *testing.B) {
	cluster := benchKafka(b)
	rates := map[string]float64{}
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		b.Run("omnibus/"+s.name, func(b *testing.B) {
			c := open(b, "kafka://"+cluster.ListenAddrs()[0]+"?fetch_max_wait=100ms")
			topic := fill(b, cluster, c, b.N, body)
			var got atomic.Int64
			done := make(chan struct{})
			n := int64(b.N)
			k, err := c.Subscribe(context.Background(), topic, func(ctx context.Context, m *omnibus.Message) error {
				if got.Add(1) == n {
					close(done)
				}
				return nil
			}, omnibus.StartFrom(omnibus.StartEarliest), omnibus.Group("bench-"+topic), omnibus.MaxInFlight(1024))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			b.ResetTimer()
			go func() { ran <- k.Run(ctx) }()
			<-done
			b.StopTimer()
			cancel()
			if err := <-ran; err != nil {
				b.Errorf("Run: %v", err)
			}
			reportRate(b, b.N, rates, "omnibus/"+s.name)
		})
		b.Run("driver/"+s.name, func(b *testing.B) {
			// The kafkabus Subscriber without the engine: Receive, then
			// Commit the last delivery of each lane, as the engine would.
			c := open(b, "kafka://"+cluster.ListenAddrs()[0]+"?fetch_max_wait=100ms")
			topic := fill(b, cluster, c, b.N, body)
			sub, err := c.Driver().Subscribe(context.Background(), topic, driver.SubscribeOptions{
				Group: "bench-" + topic, StartAt: driver.StartEarliest, MaxInFlight: 1024, Lanes: nopLanes{}})
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			committer := sub.(driver.Committer)
			b.ResetTimer()
			for got := 0; got < b.N; {
				ds, err := sub.Receive(context.Background(), driver.Room{Count: 1024, Bytes: 1 << 30})
				if err != nil {
					b.Fatal(err)
				}
				got += len(ds)
				last := map[string]*driver.Delivery{}
				for _, d := range ds {
					last[d.Lane] = d
				}
				marks := make([]*driver.Delivery, 0, len(last))
				for _, d := range last {
					marks = append(marks, d)
				}
				go func() { _ = committer.Commit(context.Background(), marks) }()
			}
			b.StopTimer()
			reportRate(b, b.N, rates, "driver/"+s.name)
		})
		b.Run("franz-go/"+s.name, func(b *testing.B) {
			c := open(b, "kafka://"+cluster.ListenAddrs()[0])
			topic := fill(b, cluster, c, b.N, body)
			assigned := make(chan struct{})
			var once sync.Once
			cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("bench-"+topic),
				kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
				kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.FetchMaxWait(100*time.Millisecond),
				kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { once.Do(func() { close(assigned) }) }))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			<-assigned // the group is joined when the client starts, before any poll
			b.ResetTimer()
			got := 0
			for got < b.N {
				fs := cl.PollRecords(context.Background(), 1024)
				fs.EachRecord(func(*kgo.Record) { got++ })
				cl.CommitOffsets(context.Background(), cl.UncommittedOffsets(), nil)
			}
			b.StopTimer()
			reportRate(b, b.N, rates, "franz-go/"+s.name)
		})
	}
	logRatios(b, "consume", rates)
}

var _ = kafkabus.Scheme

type nopLanes struct{}

func (nopLanes) Claimed([]string)                  {}
func (nopLanes) Revoked(context.Context, []string) {}
func (nopLanes) Lost([]string)                     {}

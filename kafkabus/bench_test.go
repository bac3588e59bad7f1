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

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/benchkit"
	"github.com/omnibus-go/omnibus/kafkabus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// The benchmarks compare omnibus with raw franz-go doing the same work on
// the same in-process cluster, in the same run: records with a key, the
// body and the same CloudEvents headers, acks=all and the idempotent
// producer; consuming in a group from the earliest offset, counting every
// record and committing asynchronously.
//
// Each comparison is a pair of sub-benchmarks, omnibus/<size> and
// raw/<size> (and other omnibus variants beside them), run one after the
// other in one invocation; OMNIBUS_BENCH_RAW_FIRST=1 runs the raw side
// first. go test's -count repeats each sub-benchmark in a row, so
// scripts/bench.sh runs the test binary once per round instead, flipping
// the order every other round, and prints the omnibus/raw ratios:
//
//	go test -run '^$' -bench . -benchtime 20000x ./kafkabus/
//	scripts/bench.sh

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

func benchTopic(b *testing.B, cluster *kfake.Cluster, c *omnibus.Client) string {
	topic := "bench-" + strconv.FormatInt(benchTopicN.Add(1), 10)
	if err := c.CreateTopic(context.Background(), topic, 4); err != nil {
		b.Fatalf("CreateTopic: %v", err)
	}
	// kfake keeps every record in memory: a side's records deleted after
	// it do not make the next side's collector scan them.
	b.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
		if err != nil {
			return
		}
		defer cl.Close()
		_, _ = kadm.NewClient(cl).DeleteTopics(context.Background(), topic)
	})
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

// rawProducer is franz-go's producer as a user configures it, with
// franz-go's default linger (10ms) unless opts say otherwise.
func rawProducer(b *testing.B, cluster *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.ProducerBatchCompression(kgo.NoCompression())}, opts...)...)
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
	if rates != nil {
		rates[name] = rate // the last (largest) run of a sub-benchmark wins
	}
}

// logRatios prints every side's rate against the raw side's, per size.
func logRatios(what string, rates map[string]float64) {
	for _, s := range benchSizes {
		r := rates["raw/"+s.name]
		if r == 0 {
			continue
		}
		for _, side := range []string{"omnibus", "omnibus-batch", "driver"} {
			if o := rates[side+"/"+s.name]; o > 0 {
				fmt.Printf("%s %s: %s %.0f msgs/s, raw franz-go %.0f msgs/s, %s/raw %.1f%%\n", what, s.name, side, o, r, side, 100*o/r)
			}
		}
	}
}

// BenchmarkPublish publishes batches of 100 with Client.Publish, and with
// franz-go's ProduceSync.
func BenchmarkPublish(b *testing.B) {
	cluster := benchKafka(b)
	rates := map[string]float64{}
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0]+"?durability=all")
			topic := benchTopic(b, cluster, c)
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
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0])
			topic := benchTopic(b, cluster, c)
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
			reportRate(b, b.N, rates, "raw/"+s.name)
		}})
	}
	logRatios("publish", rates)
}

// BenchmarkPublishAsync publishes one message at a time without waiting:
// an omnibus Publisher, then Flush; franz-go's Produce with a promise,
// then Flush. Each side also reports its processor time per message
// (cpu-ns/msg, kfake's included): the producer and kfake fill both cores,
// and that measure varies less than the rate (raw's rate varied 3-fold
// over 10 runs of one bench.sh session, 310 k to 957 k msgs/s).
func BenchmarkPublishAsync(b *testing.B) {
	publishAsync(b, benchKafka(b))
}

// BenchmarkPublishAsyncRTT is BenchmarkPublishAsync on a cluster that
// answers each produce request 2ms late, as a broker across a network
// does: what is in flight at once, not the CPU, sets the rate.
func BenchmarkPublishAsyncRTT(b *testing.B) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		b.Fatalf("kfake: %v", err)
	}
	defer cluster.Close()
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		cluster.SleepControl(func() { time.Sleep(2 * time.Millisecond) })
		return nil, nil, false // then handled as usual
	})
	publishAsync(b, cluster)
}

func publishAsync(b *testing.B, cluster *kfake.Cluster) {
	rates := map[string]float64{}
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0]+"?durability=all")
			topic := benchTopic(b, cluster, c)
			p, err := c.Publisher()
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			seq := 0
			_ = c.Publish(context.Background(), topic, omnibusMessages(1, body, &seq)...) // warm up the producer
			ms := omnibusMessages(b.N, body, &seq)
			results := make([]*omnibus.PublishResult, len(ms))
			stop := timed(b)
			for i, m := range ms {
				if results[i], err = p.Publish(context.Background(), topic, m); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			stop()
			for _, r := range results {
				if err := r.Err(); err != nil {
					b.Fatal(err)
				}
			}
			reportRate(b, b.N, rates, "omnibus/"+s.name)
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0])
			topic := benchTopic(b, cluster, c)
			cl := rawProducer(b, cluster)
			seq := 0
			_ = cl.ProduceSync(context.Background(), rawRecords(topic, 1, body, &seq)...).FirstErr()
			var failed atomic.Int64
			stop := timed(b)
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
			stop()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d failed", n)
			}
			reportRate(b, b.N, rates, "raw/"+s.name)
		}})
	}
	logRatios("publish async", rates)
}

// benchPublishers is how many goroutines BenchmarkPublishConcurrent
// publishes from.
const benchPublishers = 16

// publishConcurrently calls publish b.N times from benchPublishers
// goroutines, each call waiting for its outcome.
func publishConcurrently(b *testing.B, publish func(ctx context.Context, seq int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchPublishers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := publish(context.Background(), int(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkPublishConcurrent publishes one message per call from 16
// goroutines, each waiting for its acks: Client.Publish, and franz-go's
// ProduceSync on one shared client.
func BenchmarkPublishConcurrent(b *testing.B) {
	cluster := benchKafka(b)
	s := benchSizes[0]
	body := make([]byte, s.size)
	benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0]+"?durability=all")
		topic := benchTopic(b, cluster, c)
		seq := 0
		_ = c.Publish(context.Background(), topic, omnibusMessages(1, body, &seq)...)
		b.ResetTimer()
		publishConcurrently(b, func(ctx context.Context, i int) error {
			return c.Publish(ctx, topic, &omnibus.Message{Key: "key-" + strconv.Itoa(i%64), Type: "bench.event", Body: body})
		})
		b.StopTimer()
		reportRate(b, b.N, nil, "")
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
		c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0])
		topic := benchTopic(b, cluster, c)
		cl := rawProducer(b, cluster)
		seq := 0
		_ = cl.ProduceSync(context.Background(), rawRecords(topic, 1, body, &seq)...).FirstErr()
		b.ResetTimer()
		publishConcurrently(b, func(ctx context.Context, i int) error {
			seq := i
			return cl.ProduceSync(ctx, rawRecords(topic, 1, body, &seq)...).FirstErr()
		})
		b.StopTimer()
		reportRate(b, b.N, nil, "")
	}})
}

// fill publishes n records of size to a new topic, untimed.
func fill(b *testing.B, cluster *kfake.Cluster, c *omnibus.Client, n int, body []byte) string {
	b.Helper()
	topic := benchTopic(b, cluster, c)
	cl := rawProducer(b, cluster)
	seq := 0
	for i := 0; i < n; i += 1000 {
		if err := cl.ProduceSync(context.Background(), rawRecords(topic, min(1000, n-i), body, &seq)...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	return topic
}

// runUntil runs k until done is closed, timed (see timed).
func runUntil(b *testing.B, k *omnibus.Consumer, done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	stop := timed(b)
	go func() { ran <- k.Run(ctx) }()
	<-done
	stop()
	cancel()
	if err := <-ran; err != nil {
		b.Errorf("Run: %v", err)
	}
}

// timed resets b's timer and returns the function that stops it and
// reports the processor time per b.N message used meanwhile
// (cpu-ns/msg): kfake runs in this process, and publishing or consuming
// keeps both of a 2-core machine's cores busy whichever side runs, so
// each side's rate follows its processor time, which varies less from
// run to run.
func timed(b *testing.B) (stop func()) {
	b.ResetTimer()
	start := benchkit.CPUTime()
	return func() {
		b.StopTimer()
		b.ReportMetric(float64((benchkit.CPUTime()-start).Nanoseconds())/float64(b.N), "cpu-ns/msg")
	}
}

// BenchmarkConsume reads a backlog of b.N records in a group: omnibus
// with a no-op handler in key mode, omnibus with a no-op batch handler
// (defaults: key mode, batches of up to 100 taken from what has arrived),
// the kafkabus driver alone (no engine), and a bare
// franz-go poll loop committing asynchronously.
func BenchmarkConsume(b *testing.B) {
	cluster := benchKafka(b)
	rates := map[string]float64{}
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0]+"?fetch_max_wait=100ms")
			topic := fill(b, cluster, c, b.N, body)
			var got atomic.Int64
			done := make(chan struct{})
			n := int64(b.N)
			k, err := c.Subscribe(context.Background(), topic, func(ctx context.Context, m *omnibus.Message) error {
				if got.Add(1) == n {
					close(done)
				}
				return nil
			}, omnibus.StartFrom(omnibus.StartEarliest), omnibus.Group("bench-"+topic), omnibus.MaxInFlight(1024), omnibus.Order(omnibus.OrderKey))
			if err != nil {
				b.Fatal(err)
			}
			runUntil(b, k, done)
			reportRate(b, b.N, rates, "omnibus/"+s.name)
		}}, benchkit.Side{Name: "omnibus-batch", Run: func(b *testing.B) {
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0]+"?fetch_max_wait=100ms")
			topic := fill(b, cluster, c, b.N, body)
			var got atomic.Int64
			done := make(chan struct{})
			n := int64(b.N)
			k, err := c.SubscribeBatch(context.Background(), topic, func(ctx context.Context, ms []*omnibus.Message) error {
				if got.Add(int64(len(ms))) == n {
					close(done)
				}
				return nil
			}, omnibus.StartFrom(omnibus.StartEarliest), omnibus.Group("bench-"+topic), omnibus.MaxInFlight(1024))
			if err != nil {
				b.Fatal(err)
			}
			runUntil(b, k, done)
			reportRate(b, b.N, rates, "omnibus-batch/"+s.name)
		}}, benchkit.Side{Name: "driver", Run: func(b *testing.B) {
			// The kafkabus Subscriber without the engine: Receive, then
			// Commit the last delivery of each lane, as the engine would.
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0]+"?fetch_max_wait=100ms")
			topic := fill(b, cluster, c, b.N, body)
			sub, err := c.Driver().Subscribe(context.Background(), topic, driver.SubscribeOptions{
				Group: "bench-" + topic, StartAt: driver.StartEarliest, MaxInFlight: 1024, Lanes: nopLanes{}})
			if err != nil {
				b.Fatal(err)
			}
			defer sub.Close()
			committer := sub.(driver.Committer)
			stop := timed(b)
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
			stop()
			reportRate(b, b.N, rates, "driver/"+s.name)
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
			c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0])
			topic := fill(b, cluster, c, b.N, body)
			// Timed from the client's start, joining the group included,
			// as omnibus's side is timed from Run.
			stop := timed(b)
			cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("bench-"+topic),
				kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
				kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				b.Fatal(err)
			}
			defer cl.Close()
			got := 0
			for got < b.N {
				fs := cl.PollRecords(context.Background(), 1024)
				fs.EachRecord(func(*kgo.Record) { got++ })
				cl.CommitOffsets(context.Background(), cl.UncommittedOffsets(), nil)
			}
			stop()
			reportRate(b, b.N, rates, "raw/"+s.name)
		}})
	}
	logRatios("consume", rates)
}

// BenchmarkLatency publishes 100-byte messages at a paced 1,000 msgs/s
// (b.Loop's iterations: -benchtime 3s is about 3,000 messages) while a
// group consumer reads them, and reports the p50, p99 and largest
// publish→handler latency: an omnibus Publisher and Subscribe, and
// franz-go's Produce and a poll loop (auto-committing). The raw producer
// lingers 0, as kafkabus's does by default (franz-go's default, 10ms,
// would put 5-10ms on raw's side).
func BenchmarkLatency(b *testing.B) {
	cluster := benchKafka(b)
	benchkit.RunSides(b, "100B", benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0]+"?durability=all")
		topic := benchTopic(b, cluster, c)
		p := benchkit.Publisher(b, c)
		seq := 0
		benchkit.Latency(b, c, topic, func(body []byte) error {
			seq++
			_, err := p.Publish(context.Background(), topic, &omnibus.Message{Key: "key-" + strconv.Itoa(seq%64), Type: "bench.event", Body: body})
			return err
		}, omnibus.StartFrom(omnibus.StartEarliest), omnibus.Group("bench-"+topic))
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
		c := transporttest.Open(b, "kafka://"+cluster.ListenAddrs()[0])
		topic := benchTopic(b, cluster, c)
		pr := rawProducer(b, cluster, kgo.ProducerLinger(0))
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("bench-"+topic),
			kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.Balancers(kgo.CooperativeStickyBalancer()))
		if err != nil {
			b.Fatal(err)
		}
		r := benchkit.NewRecorder()
		ctx, cancel := context.WithCancel(context.Background())
		polled := make(chan struct{})
		go func() {
			defer close(polled)
			for ctx.Err() == nil {
				cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { r.Received(rec.Value) })
			}
		}()
		defer func() {
			cancel()
			<-polled
			cl.Close()
		}()
		var failed atomic.Int64
		seq := 0
		benchkit.MeasureLatency(b, r, func(body []byte) error {
			rec := rawRecords(topic, 1, body, &seq)[0]
			pr.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Add(1)
				}
			})
			return nil
		})
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d failed", n)
		}
	}})
}

var _ = kafkabus.Scheme

type nopLanes struct{}

func (nopLanes) Claimed([]string)                  {}
func (nopLanes) Revoked(context.Context, []string) {}
func (nopLanes) Lost([]string)                     {}

package natsbus_test

import (
	"context"
	"encoding/binary"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
)

// Benchmarks compare omnibus with raw nats.go jetstream doing the same
// work against the same server (NATS_URL, else 127.0.0.1:4222) in one
// run. Each comparison is a pair of sub-benchmarks, omnibus/<size> and
// raw/<size>, run one after the other; OMNIBUS_BENCH_RAW_FIRST=1 runs
// the raw side first. go test's -count repeats each sub-benchmark in a
// row, so scripts/bench.sh runs the test binary once per round instead,
// flipping the order every other round, and prints the omnibus/raw
// ratios:
//
//	go test -run '^$' -bench . -benchtime 20000x ./natsbus/
//
// Every stream a side creates starts with its topic's name and is
// deleted at the end of the side's run (topicName's cleanup).

const benchBatch = 100

var benchSizes = []struct {
	name string
	size int
}{{"100B", 100}, {"1KiB", 1024}}

// benchSide is one side of a comparison.
type benchSide struct {
	name string
	run  func(b *testing.B)
}

// runSides runs the sides as sub-benchmarks <side>/<size>, in the order
// given, or reversed when OMNIBUS_BENCH_RAW_FIRST is set.
func runSides(b *testing.B, size string, sides ...benchSide) {
	if os.Getenv("OMNIBUS_BENCH_RAW_FIRST") != "" {
		slices.Reverse(sides)
	}
	for _, s := range sides {
		b.Run(s.name+"/"+size, s.run)
	}
}

func reportRate(b *testing.B, n int) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

func rawJS(b *testing.B, serverURL string, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	b.Helper()
	nc, err := nats.Connect(serverURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc, append([]jetstream.JetStreamOpt{jetstream.WithPublishAsyncMaxPending(natsbus.DefaultPublishWindow)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	return js
}

// rawStream creates the stream name (subject name) as natsbus creates a
// topic's: file storage, natsbus's duplicate window.
func rawStream(b *testing.B, js jetstream.JetStream, name string) {
	b.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.FileStorage, Duplicates: natsbus.DefaultDupeWindow}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
}

// rawMsg is what omnibus puts on the wire for a message: a message ID
// (deduplicated by the server) and the CloudEvents attributes.
func rawMsg(subject string, body []byte) *nats.Msg {
	id := omnibus.NewID()
	return &nats.Msg{Subject: subject, Data: body, Header: nats.Header{
		jetstream.MsgIDHeader:     {id},
		natsbus.HeaderID:          {id},
		natsbus.HeaderSpecVersion: {"1.0"},
		natsbus.HeaderTime:        {time.Now().UTC().Format(time.RFC3339Nano)},
	}}
}

// rawPublish publishes n messages in batches of benchBatch, each batch
// published asynchronously and waited for.
func rawPublish(b *testing.B, js jetstream.JetStream, subject string, n int, body []byte) {
	b.Helper()
	futs := make([]jetstream.PubAckFuture, 0, benchBatch)
	for i := 0; i < n; i += benchBatch {
		futs = futs[:0]
		for j := i; j < min(n, i+benchBatch); j++ {
			f, err := js.PublishMsgAsync(rawMsg(subject, body))
			if err != nil {
				b.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	}
}

// omnibusPublish publishes n messages with Client.Publish in batches of
// benchBatch.
func omnibusPublish(b *testing.B, c *omnibus.Client, topic string, n int, body []byte) {
	b.Helper()
	ctx := context.Background()
	ms := make([]*omnibus.Message, benchBatch)
	for i := 0; i < n; i += benchBatch {
		ms = ms[:min(benchBatch, n-i)]
		for j := range ms {
			ms[j] = &omnibus.Message{Body: body}
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublish publishes batches of 100 waiting for each batch's
// acks: Client.Publish, and jetstream's PublishMsgAsync with the futures
// waited for.
func BenchmarkPublish(b *testing.B) {
	u := externalURL(b)
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		runSides(b, s.name, benchSide{"omnibus", func(b *testing.B) {
			c := open(b, u)
			topic := topicName(b, u)
			omnibusPublish(b, c, topic, benchBatch, body) // creates the stream
			debug.FreeOSMemory()
			b.ResetTimer()
			omnibusPublish(b, c, topic, b.N, body)
			b.StopTimer()
			reportRate(b, b.N)
		}}, benchSide{"raw", func(b *testing.B) {
			js := rawJS(b, u)
			name := topicName(b, u) + "-raw"
			rawStream(b, js, name)
			rawPublish(b, js, name, benchBatch, body)
			debug.FreeOSMemory()
			b.ResetTimer()
			rawPublish(b, js, name, b.N, body)
			b.StopTimer()
			reportRate(b, b.N)
		}})
	}
}

// BenchmarkPublishAsync publishes one message at a time without waiting:
// an omnibus Publisher, then Flush; jetstream's PublishMsgAsync with a
// window of natsbus.DefaultPublishWindow unacknowledged (the window
// natsbus keeps), errors counted by the error handler, then
// PublishAsyncComplete.
func BenchmarkPublishAsync(b *testing.B) {
	u := externalURL(b)
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		runSides(b, s.name, benchSide{"omnibus", func(b *testing.B) {
			c := open(b, u)
			topic := topicName(b, u)
			omnibusPublish(b, c, topic, benchBatch, body) // creates the stream
			p, err := c.Publisher()
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			ms := make([]*omnibus.Message, b.N)
			for i := range ms {
				ms[i] = &omnibus.Message{Body: body}
			}
			results := make([]*omnibus.PublishResult, b.N)
			debug.FreeOSMemory()
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
			reportRate(b, b.N)
		}}, benchSide{"raw", func(b *testing.B) {
			var failed atomic.Int64
			js := rawJS(b, u, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
			name := topicName(b, u) + "-raw"
			rawStream(b, js, name)
			rawPublish(b, js, name, benchBatch, body)
			// A full window stalls PublishMsgAsync; wait as long as
			// omnibus's Publisher would, rather than failing after
			// jetstream's default 200ms.
			stall := []jetstream.PublishOpt{jetstream.WithStallWait(time.Minute)}
			debug.FreeOSMemory()
			b.ResetTimer()
			for range b.N {
				if _, err := js.PublishMsgAsync(rawMsg(name, body), stall...); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatalf("%d publishes still pending after a minute", js.PublishAsyncPending())
			}
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d failed", n)
			}
			reportRate(b, b.N)
		}})
	}
}

// benchPublishers is how many goroutines BenchmarkPublishConcurrent
// publishes from.
const benchPublishers = 16

// publishConcurrently calls publish b.N times from benchPublishers
// goroutines, each call waiting for its outcome.
func publishConcurrently(b *testing.B, publish func(ctx context.Context) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchPublishers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := publish(context.Background()); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkPublishConcurrent publishes one message per call from 16
// goroutines, each waiting for its ack: Client.Publish, and jetstream's
// PublishMsg on one shared connection.
func BenchmarkPublishConcurrent(b *testing.B) {
	u := externalURL(b)
	s := benchSizes[0]
	body := make([]byte, s.size)
	runSides(b, s.name, benchSide{"omnibus", func(b *testing.B) {
		c := open(b, u)
		topic := topicName(b, u)
		omnibusPublish(b, c, topic, benchBatch, body) // creates the stream
		b.ResetTimer()
		publishConcurrently(b, func(ctx context.Context) error {
			return c.Publish(ctx, topic, &omnibus.Message{Body: body})
		})
		b.StopTimer()
		reportRate(b, b.N)
	}}, benchSide{"raw", func(b *testing.B) {
		js := rawJS(b, u)
		name := topicName(b, u) + "-raw"
		rawStream(b, js, name)
		rawPublish(b, js, name, benchBatch, body)
		b.ResetTimer()
		publishConcurrently(b, func(ctx context.Context) error {
			_, err := js.PublishMsg(ctx, rawMsg(name, body))
			return err
		})
		b.StopTimer()
		reportRate(b, b.N)
	}})
}

// benchWindow is the consume benchmark's in-flight window, the same on
// both sides: omnibus.MaxInFlight for omnibus, and the pull and ack-pending
// sizes natsbus derives from it for raw jetstream.
const benchWindow = 1024

// BenchmarkConsume reads a backlog of b.N messages, each side its own
// stream filled beforehand: omnibus with a consumer group and a no-op
// handler, and a raw durable pull consumer (Messages, Ack per message).
func BenchmarkConsume(b *testing.B) {
	u := externalURL(b)
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		runSides(b, s.name, benchSide{"omnibus", func(b *testing.B) {
			c := open(b, u)
			topic := topicName(b, u)
			omnibusPublish(b, c, topic, b.N, body)
			ctx := context.Background()
			debug.FreeOSMemory()
			b.ResetTimer()
			var got atomic.Int64
			done := make(chan struct{})
			k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error {
				if got.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			}, omnibus.Group("bench"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(omnibus.OrderNone), omnibus.MaxInFlight(benchWindow))
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = k.Run(ctx) }()
			<-done
			b.StopTimer()
			_ = k.Shutdown(ctx)
			reportRate(b, b.N)
		}}, benchSide{"raw", func(b *testing.B) {
			js := rawJS(b, u)
			name := topicName(b, u) + "-raw"
			rawStream(b, js, name)
			rawPublish(b, js, name, b.N, body)
			ctx := context.Background()
			debug.FreeOSMemory()
			b.ResetTimer()
			// The consumer natsbus makes for a member of MaxInFlight
			// benchWindow; each message's ID and delivery count read, as
			// omnibus hands them to a handler; Ack fire and forget.
			cons, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{
				Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: 16 * benchWindow})
			if err != nil {
				b.Fatal(err)
			}
			it, err := cons.Messages(jetstream.PullMaxMessages(benchWindow))
			if err != nil {
				b.Fatal(err)
			}
			defer it.Stop()
			for range b.N {
				m, err := it.Next()
				if err != nil {
					b.Fatal(err)
				}
				md, err := m.Metadata()
				if err != nil || md.NumDelivered == 0 || m.Headers().Get(natsbus.HeaderID) == "" {
					b.Fatal("no metadata or message ID", err)
				}
				_ = m.Ack()
			}
			b.StopTimer()
			reportRate(b, b.N)
		}})
	}
}

// BenchmarkLatency publishes 100-byte messages at a paced 1,000 msgs/s
// (b.Loop's iterations: -benchtime 3s is about 3,000 messages) while a
// group consumer reads them, and reports the p50, p99 and largest
// publish→handler latency: an omnibus Publisher and Subscribe, and
// jetstream's PublishMsgAsync and a pull consumer's Messages loop acking
// each message.
func BenchmarkLatency(b *testing.B) {
	u := externalURL(b)
	runSides(b, "100B", benchSide{"omnibus", func(b *testing.B) {
		c := open(b, u)
		topic := topicName(b, u)
		omnibusPublish(b, c, topic, 1, []byte{0}) // creates the stream
		p, err := c.Publisher()
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close(context.Background())
		r := newLatencyRecorder()
		k, err := c.Subscribe(context.Background(), topic, func(_ context.Context, m *omnibus.Message) error {
			r.received(m.Body)
			return nil
		}, omnibus.Group("bench"), omnibus.StartFrom(omnibus.StartEarliest))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- k.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-ran; err != nil {
				b.Errorf("Run: %v", err)
			}
		}()
		measureLatency(b, r, func(body []byte) error {
			_, err := p.Publish(context.Background(), topic, &omnibus.Message{Body: body})
			return err
		})
	}}, benchSide{"raw", func(b *testing.B) {
		var failed atomic.Int64
		js := rawJS(b, u, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
		name := topicName(b, u) + "-raw"
		rawStream(b, js, name)
		cons, err := js.CreateConsumer(context.Background(), name, jetstream.ConsumerConfig{
			Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			b.Fatal(err)
		}
		r := newLatencyRecorder()
		cc, err := cons.Consume(func(m jetstream.Msg) {
			r.received(m.Data())
			_ = m.Ack()
		})
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Stop()
		measureLatency(b, r, func(body []byte) error {
			_, err := js.PublishMsgAsync(rawMsg(name, body))
			return err
		})
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d failed", n)
		}
	}})
}

// latencyRecorder collects publish→handler latencies. A message's body
// carries its publish time (Unix nanoseconds) and a warm-up flag.
type latencyRecorder struct {
	warm     chan struct{} // closed when a warm-up message arrives
	warmOnce sync.Once
	mu       sync.Mutex
	lat      []time.Duration
}

func newLatencyRecorder() *latencyRecorder { return &latencyRecorder{warm: make(chan struct{})} }

// latencyMessage is a 100-byte body stamped with the time now.
func latencyMessage(warm bool) []byte {
	body := make([]byte, 100)
	binary.BigEndian.PutUint64(body, uint64(time.Now().UnixNano()))
	if warm {
		body[8] = 1
	}
	return body
}

// received records the latency of a body a consumer got.
func (r *latencyRecorder) received(body []byte) {
	if len(body) < 9 {
		return
	}
	d := time.Duration(time.Now().UnixNano() - int64(binary.BigEndian.Uint64(body)))
	if body[8] == 1 {
		r.warmOnce.Do(func() { close(r.warm) })
		return
	}
	r.mu.Lock()
	r.lat = append(r.lat, d)
	r.mu.Unlock()
}

func (r *latencyRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lat)
}

// measureLatency sends warm-up messages until one arrives (the consumer
// is then in place), then one message per b.Loop iteration at a paced
// 1,000 msgs/s; it waits for them all and reports the p50, p99 and
// largest latency in milliseconds.
func measureLatency(b *testing.B, r *latencyRecorder, send func(body []byte) error) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for ready := false; !ready; {
		if err := send(latencyMessage(true)); err != nil {
			b.Fatal(err)
		}
		select {
		case <-r.warm:
			ready = true
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				b.Fatal("no warm-up message arrived within a minute")
			}
		}
	}
	sent := 0
	var start time.Time
	for b.Loop() {
		if sent == 0 {
			start = time.Now()
		}
		if d := time.Until(start.Add(time.Duration(sent) * time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
		if err := send(latencyMessage(false)); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	for deadline := time.Now().Add(time.Minute); r.count() < sent; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages arrived within a minute", r.count(), sent)
		}
	}
	r.mu.Lock()
	lat := slices.Clone(r.lat)
	r.mu.Unlock()
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
	b.ReportMetric(at(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkEmbeddedStartup measures starting the embedded server (with
// JetStream on a fresh directory) until it accepts connections.
func BenchmarkEmbeddedStartup(b *testing.B) {
	// Capped, so that -benchtime 20000x for the other benchmarks does not
	// start 20,000 servers.
	n := min(b.N, 20)
	var total time.Duration
	for i := 0; i < n; i++ {
		s, err := natsbus.StartServer(context.Background(), natsbus.ServerConfig{Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		total += s.StartupTime()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(n), "startup-ms")
}

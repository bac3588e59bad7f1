package natsbus_test

import (
	"context"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/benchkit"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
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
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			c := transporttest.Open(b, u)
			topic := topicName(b, u)
			omnibusPublish(b, c, topic, benchBatch, body) // creates the stream
			debug.FreeOSMemory()
			b.ResetTimer()
			omnibusPublish(b, c, topic, b.N, body)
			b.StopTimer()
			benchkit.ReportRate(b, b.N)
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
			js := rawJS(b, u)
			name := topicName(b, u) + "-raw"
			rawStream(b, js, name)
			rawPublish(b, js, name, benchBatch, body)
			debug.FreeOSMemory()
			b.ResetTimer()
			rawPublish(b, js, name, b.N, body)
			b.StopTimer()
			benchkit.ReportRate(b, b.N)
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
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			c := transporttest.Open(b, u)
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
			benchkit.ReportRate(b, b.N)
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
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
			benchkit.ReportRate(b, b.N)
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
	benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		c := transporttest.Open(b, u)
		topic := topicName(b, u)
		omnibusPublish(b, c, topic, benchBatch, body) // creates the stream
		b.ResetTimer()
		publishConcurrently(b, func(ctx context.Context) error {
			return c.Publish(ctx, topic, &omnibus.Message{Body: body})
		})
		b.StopTimer()
		benchkit.ReportRate(b, b.N)
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
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
		benchkit.ReportRate(b, b.N)
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
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			c := transporttest.Open(b, u)
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
			benchkit.ReportRate(b, b.N)
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
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
			benchkit.ReportRate(b, b.N)
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
	benchkit.RunSides(b, "100B", benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		c := transporttest.Open(b, u)
		topic := topicName(b, u)
		omnibusPublish(b, c, topic, 1, []byte{0}) // creates the stream
		p := benchkit.Publisher(b, c)
		benchkit.Latency(b, c, topic, func(body []byte) error {
			_, err := p.Publish(context.Background(), topic, &omnibus.Message{Body: body})
			return err
		}, omnibus.Group("bench"), omnibus.StartFrom(omnibus.StartEarliest))
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
		var failed atomic.Int64
		js := rawJS(b, u, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
		name := topicName(b, u) + "-raw"
		rawStream(b, js, name)
		cons, err := js.CreateConsumer(context.Background(), name, jetstream.ConsumerConfig{
			Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
		if err != nil {
			b.Fatal(err)
		}
		r := benchkit.NewRecorder()
		cc, err := cons.Consume(func(m jetstream.Msg) {
			r.Received(m.Data())
			_ = m.Ack()
		})
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Stop()
		benchkit.MeasureLatency(b, r, func(body []byte) error {
			_, err := js.PublishMsgAsync(rawMsg(name, body))
			return err
		})
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d failed", n)
		}
	}})
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

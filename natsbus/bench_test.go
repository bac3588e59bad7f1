package natsbus_test

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
)

// Benchmarks run omnibus and raw nats.go jetstream side by side against
// the same server in one run and report both rates and their ratio:
//
//	go test -run '^$' -bench . -benchtime 20000x ./natsbus/

const benchBatch = 100

func rawJS(b *testing.B, serverURL string) (*nats.Conn, jetstream.JetStream) {
	b.Helper()
	nc, err := nats.Connect(serverURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natsbus.DefaultPublishWindow+1))
	if err != nil {
		b.Fatal(err)
	}
	return nc, js
}

func rawStream(b *testing.B, js jetstream.JetStream, name string) {
	b.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.FileStorage, Duplicates: natsbus.DefaultDupeWindow}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
}

// rawPublish publishes n messages as omnibus does: asynchronously, with
// a message ID, waiting for every ack in batches.
func rawPublish(b *testing.B, js jetstream.JetStream, subject string, n int, body []byte) {
	b.Helper()
	futs := make([]jetstream.PubAckFuture, 0, benchBatch)
	for i := 0; i < n; i += benchBatch {
		futs = futs[:0]
		for j := i; j < min(n, i+benchBatch); j++ {
			// The same CloudEvents attributes omnibus sends, so both sides
			// move the same bytes.
			id := omnibus.NewID()
			m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{
				jetstream.MsgIDHeader:     {id},
				natsbus.HeaderID:          {id},
				natsbus.HeaderSpecVersion: {"1.0"},
				natsbus.HeaderTime:        {time.Now().UTC().Format(time.RFC3339Nano)},
			}}
			f, err := js.PublishMsgAsync(m)
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

func report(b *testing.B, n int, omni, raw time.Duration) {
	o := float64(n) / omni.Seconds()
	r := float64(n) / raw.Seconds()
	b.ReportMetric(o, "omnibus-msgs/s")
	b.ReportMetric(r, "raw-msgs/s")
	b.ReportMetric(o/r, "ratio")
	b.ReportMetric(0, "ns/op")
}

func benchServers(b *testing.B) map[string]string {
	return map[string]string{"external": externalURL(b)}
}

func BenchmarkPublish(b *testing.B) {
	for name, u := range benchServers(b) {
		for _, size := range []int{100, 1024} {
			b.Run(fmt.Sprintf("%s/%dB", name, size), func(b *testing.B) {
				body := make([]byte, size)
				c := open(b, u)
				_, js := rawJS(b, u)
				topic := topicName(b, u)
				rawName := topic + "-raw"
				rawStream(b, js, rawName)
				// Warm up: create the stream and the connections' state.
				omnibusPublish(b, c, topic, benchBatch, body)
				rawPublish(b, js, rawName, benchBatch, body)
				b.ResetTimer()
				start := time.Now()
				omnibusPublish(b, c, topic, b.N, body)
				omni := time.Since(start)
				start = time.Now()
				rawPublish(b, js, rawName, b.N, body)
				raw := time.Since(start)
				b.StopTimer()
				report(b, b.N, omni, raw)
			})
		}
	}
}

// benchWindow is the consume benchmark's in-flight window, the same on
// both sides: omnibus.MaxInFlight for omnibus, and the pull and ack-pending
// sizes natsbus derives from it for raw jetstream.
const benchWindow = 1024

func BenchmarkConsume(b *testing.B) {
	for name, u := range benchServers(b) {
		for _, size := range []int{100, 1024} {
			b.Run(fmt.Sprintf("%s/%dB", name, size), func(b *testing.B) {
				body := make([]byte, size)
				c := open(b, u)
				_, js := rawJS(b, u)
				topic := topicName(b, u)
				rawName := topic + "-raw"
				rawStream(b, js, rawName)
				omnibusPublish(b, c, topic, b.N, body)
				rawPublish(b, js, rawName, b.N, body)
				ctx := context.Background()
				b.ResetTimer()

				// omnibus: a consumer group reading everything, unordered.
				// Each side starts with the memory of the publishing above
				// given back, so neither pays for the other's garbage.
				debug.FreeOSMemory()
				start := time.Now()
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
				omni := time.Since(start)
				_ = k.Shutdown(ctx)

				// raw: a durable pull consumer, Messages iterator, Ack, with
				// the window natsbus gives a member of MaxInFlight benchWindow.
				// It reads what omnibus hands a handler: the message ID and
				// the delivery count.
				debug.FreeOSMemory()
				start = time.Now()
				cons, err := js.CreateConsumer(ctx, rawName, jetstream.ConsumerConfig{
					Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: 16 * benchWindow})
				if err != nil {
					b.Fatal(err)
				}
				it, err := cons.Messages(jetstream.PullMaxMessages(2 * benchWindow))
				if err != nil {
					b.Fatal(err)
				}
				for i := 0; i < b.N; i++ {
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
				raw := time.Since(start)
				it.Stop()
				b.StopTimer()
				report(b, b.N, omni, raw)
			})
		}
	}
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

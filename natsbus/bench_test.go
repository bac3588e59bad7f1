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

// BenchmarkPublish publishes b.N messages on each side, in the order
// omnibus, raw, raw, omnibus (b.N/2 each time), as BenchmarkConsume does.
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
				half := max(1, b.N/2)
				timed := func(publish func()) time.Duration {
					debug.FreeOSMemory()
					start := time.Now()
					publish()
					return time.Since(start)
				}
				omniRun := func() { omnibusPublish(b, c, topic, half, body) }
				rawRun := func() { rawPublish(b, js, rawName, half, body) }
				b.ResetTimer()
				omni := timed(omniRun)
				raw := timed(rawRun) + timed(rawRun)
				omni += timed(omniRun)
				b.StopTimer()
				report(b, 2*half, omni, raw)
			})
		}
	}
}

// benchWindow is the consume benchmark's in-flight window, the same on
// both sides: omnibus.MaxInFlight for omnibus, and the pull and ack-pending
// sizes natsbus derives from it for raw jetstream.
const benchWindow = 1024

// BenchmarkConsume measures in the order omnibus, raw, raw, omnibus, each
// on its own stream of b.N/2 messages, and adds up each side's time, so
// that a drift of the shared machine over the run (the server's caches,
// other work) weighs on both sides alike.
func BenchmarkConsume(b *testing.B) {
	for name, u := range benchServers(b) {
		for _, size := range []int{100, 1024} {
			b.Run(fmt.Sprintf("%s/%dB", name, size), func(b *testing.B) {
				body := make([]byte, size)
				c := open(b, u)
				_, js := rawJS(b, u)
				topic := topicName(b, u)
				half := max(1, b.N/2)
				omniTopics := []string{topic + "-1", topic + "-2"}
				rawNames := []string{topic + "-raw1", topic + "-raw2"}
				for i := range 2 { // topicName's cleanup deletes them all
					omnibusPublish(b, c, omniTopics[i], half, body)
					rawStream(b, js, rawNames[i])
					rawPublish(b, js, rawNames[i], half, body)
				}
				b.ResetTimer()
				omni := consumeOmnibus(b, c, omniTopics[0], half)
				raw := consumeRaw(b, js, rawNames[0], half)
				raw += consumeRaw(b, js, rawNames[1], half)
				omni += consumeOmnibus(b, c, omniTopics[1], half)
				b.StopTimer()
				report(b, 2*half, omni, raw)
			})
		}
	}
}

// consumeOmnibus reads n messages of topic with a consumer group,
// unordered, and returns the time it took. It starts with the memory of
// what ran before given back, so that no side pays for another's garbage.
func consumeOmnibus(b *testing.B, c *omnibus.Client, topic string, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	debug.FreeOSMemory()
	start := time.Now()
	var got atomic.Int64
	done := make(chan struct{})
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error {
		if got.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}, omnibus.Group("bench"), omnibus.StartFrom(omnibus.StartEarliest), omnibus.Order(omnibus.OrderNone), omnibus.MaxInFlight(benchWindow))
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = k.Run(ctx) }()
	<-done
	d := time.Since(start)
	_ = k.Shutdown(ctx)
	return d
}

// consumeRaw reads n messages of stream name as omnibus does: a durable
// pull consumer, the Messages iterator and Ack, with the window natsbus
// gives a member of MaxInFlight benchWindow. It reads what omnibus hands a
// handler: the message ID and the delivery count.
func consumeRaw(b *testing.B, js jetstream.JetStream, name string, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	debug.FreeOSMemory()
	start := time.Now()
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
	for range n {
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
	return time.Since(start)
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

package rabbitbus

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/benchkit"
)

// The benchmarks compare omnibus with raw amqp091-go doing the same work
// on the same server, in one run. Each comparison is a pair of
// sub-benchmarks, omnibus/<size> and raw/<size>, run one after the
// other; OMNIBUS_BENCH_RAW_FIRST=1 runs the raw side first. go test's
// -count repeats each sub-benchmark in a row, so scripts/bench.sh runs
// the test binary once per round instead, flipping the order every other
// round, and prints the omnibus/raw ratios:
//
//	go test -run '^$' -bench . -benchtime 10000x ./rabbitbus/
//
// Each side declares its own exchange and queues and deletes them at the
// end of its run.

// benchWindow is the in-flight window both sides get in BenchmarkPublish
// (unconfirmed publishes) and BenchmarkConsume (the consumer's prefetch).
const benchWindow = 256

var benchSizes = []struct {
	name string
	size int
}{{"100B", 100}, {"1KiB", 1024}}

// benchTopology declares a fresh topic exchange and the named queues
// bound to all of it (classic queues, as rabbitbus declares a group's),
// deleted at cleanup. It returns the exchange's name and a raw
// connection.
func benchTopology(b *testing.B, queues ...string) (string, *amqp.Connection) {
	b.Helper()
	topic := fmt.Sprintf("omnibus-bench-%x", rand.Uint32())
	ac, ch := rawChannel(b)
	b.Cleanup(func() { _ = ac.Close() })
	if err := declareTopic(ch, topic); err != nil {
		b.Fatal(err)
	}
	names := []string{"x:" + topic}
	for _, q := range queues {
		q = topic + q
		if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: "classic"}); err != nil {
			b.Fatal(err)
		}
		if err := ch.QueueBind(q, "#", topic, false, nil); err != nil {
			b.Fatal(err)
		}
		names = append(names, "q:"+q)
	}
	_ = ch.Close()
	b.Cleanup(func() { deleteTopology(b, names) })
	return topic, ac
}

// rawPublishing is what omnibus puts on the wire for a keyless message
// (message-id, type, timestamp, the CloudEvents headers), persistent; its
// routing key is its ID.
func rawPublishing(body []byte) (string, amqp.Publishing) {
	id := omnibus.NewID()
	now := time.Now()
	return id, amqp.Publishing{
		Headers: amqp.Table{
			"cloudEvents:specversion": "1.0", "cloudEvents:id": id, "cloudEvents:type": "bench",
			"cloudEvents:time": now.UTC().Format(time.RFC3339Nano), hdrKeyless: true,
		},
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Type:         "bench",
		Timestamp:    now,
		Body:         body,
	}
}

// publishRaw publishes n messages on a confirm-mode channel of its own
// with a sliding window of size unconfirmed.
func publishRaw(b *testing.B, ac *amqp.Connection, topic string, body []byte, n, size int) {
	ch, err := ac.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	pending := make([]*amqp.DeferredConfirmation, 0, size)
	for i := range n {
		if len(pending) == size {
			if ok, err := pending[0].WaitContext(context.Background()); err != nil || !ok {
				b.Fatalf("confirm: ack=%v err=%v", ok, err)
			}
			pending = pending[1:]
		}
		key, pub := rawPublishing(body)
		dc, err := ch.PublishWithDeferredConfirm(topic, key, false, false, pub)
		if err != nil {
			b.Fatalf("publish %d: %v", i, err)
		}
		pending = append(pending, dc)
	}
	for _, dc := range pending {
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			b.Fatalf("confirm: ack=%v err=%v", ok, err)
		}
	}
}

// BenchmarkPublish publishes b.N persistent messages with publisher
// confirms: omnibus from 4 goroutines publishing batches of 64 (at most
// 256 unconfirmed), raw with a sliding window of 256 deferred confirms.
func BenchmarkPublish(b *testing.B) {
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			ctx := context.Background()
			c := open(ctx, b, "")
			topic, _ := benchTopology(b, ":sink")
			b.ResetTimer()
			const publishers, batch = 4, benchWindow / 4
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			for range publishers {
				wg.Go(func() {
					ms := make([]*omnibus.Message, 0, batch)
					for {
						k := min(int64(batch), left.Add(-batch)+batch)
						if k <= 0 {
							return
						}
						ms = ms[:0]
						for range k {
							ms = append(ms, &omnibus.Message{Type: "bench", Body: body})
						}
						if err := c.Publish(ctx, topic, ms...); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			benchkit.ReportRate(b, b.N)
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
			topic, ac := benchTopology(b, ":sink")
			b.ResetTimer()
			publishRaw(b, ac, topic, body, b.N, benchWindow)
			b.StopTimer()
			benchkit.ReportRate(b, b.N)
		}})
	}
}

// BenchmarkPublishAsync publishes one message at a time without waiting:
// an omnibus Publisher, then Flush; raw with a sliding window of
// deferred confirms as large as rabbitbus's (window, 1,024).
func BenchmarkPublishAsync(b *testing.B) {
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			ctx := context.Background()
			c := open(ctx, b, "")
			topic, _ := benchTopology(b, ":sink")
			p, err := c.Publisher()
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(ctx)
			ms := make([]*omnibus.Message, b.N)
			for i := range ms {
				ms[i] = &omnibus.Message{Type: "bench", Body: body}
			}
			results := make([]*omnibus.PublishResult, b.N)
			b.ResetTimer()
			for i, m := range ms {
				if results[i], err = p.Publish(ctx, topic, m); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.Flush(ctx); err != nil {
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
			topic, ac := benchTopology(b, ":sink")
			b.ResetTimer()
			publishRaw(b, ac, topic, body, b.N, window)
			b.StopTimer()
			benchkit.ReportRate(b, b.N)
		}})
	}
}

// benchPublishers is how many goroutines BenchmarkPublishConcurrent
// publishes from.
const benchPublishers = 16

// BenchmarkPublishConcurrent publishes one message per call from 16
// goroutines, each waiting for its confirm: Client.Publish, and raw with
// a confirm-mode channel per goroutine on one connection.
func BenchmarkPublishConcurrent(b *testing.B) {
	s := benchSizes[0]
	body := make([]byte, s.size)
	benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		ctx := context.Background()
		c := open(ctx, b, "")
		topic, _ := benchTopology(b, ":sink")
		b.ResetTimer()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range benchPublishers {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					if err := c.Publish(ctx, topic, &omnibus.Message{Type: "bench", Body: body}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		benchkit.ReportRate(b, b.N)
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
		ctx := context.Background()
		topic, ac := benchTopology(b, ":sink")
		chs := make([]*amqp.Channel, benchPublishers)
		for i := range chs {
			ch, err := ac.Channel()
			if err != nil {
				b.Fatal(err)
			}
			if err := ch.Confirm(false); err != nil {
				b.Fatal(err)
			}
			chs[i] = ch
		}
		b.ResetTimer()
		var next atomic.Int64
		var wg sync.WaitGroup
		for _, ch := range chs {
			wg.Go(func() {
				for next.Add(1) <= int64(b.N) {
					key, pub := rawPublishing(body)
					dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, topic, key, false, false, pub)
					if err != nil {
						b.Error(err)
						return
					}
					if ok, err := dc.WaitContext(ctx); err != nil || !ok {
						b.Errorf("confirm: ack=%v err=%v", ok, err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		benchkit.ReportRate(b, b.N)
	}})
}

// consumeAckEvery is how many deliveries raw BenchmarkConsume acks at
// once (multiple=true).
const consumeAckEvery = benchWindow / 4

// BenchmarkConsume reads a backlog of b.N messages, each side from its
// own queue filled beforehand: omnibus with a no-op handler and
// MaxInFlight 256, raw with basic.consume, prefetch 256 and a multiple
// ack every 64 deliveries.
func BenchmarkConsume(b *testing.B) {
	for _, s := range benchSizes {
		body := make([]byte, s.size)
		benchkit.RunSides(b, s.name, benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
			ctx := context.Background()
			c := open(ctx, b, "")
			topic, ac := benchTopology(b, ":bench") // groupQueue(topic, "bench")
			publishRaw(b, ac, topic, body, b.N, window)
			b.ResetTimer()
			var n atomic.Int64
			done := make(chan struct{})
			k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error {
				if n.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			}, omnibus.Group("bench"), omnibus.MaxInFlight(benchWindow))
			if err != nil {
				b.Fatal(err)
			}
			rctx, rcancel := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- k.Run(rctx) }()
			<-done
			b.StopTimer()
			rcancel()
			<-ran
			benchkit.ReportRate(b, b.N)
		}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
			topic, ac := benchTopology(b, ":raw")
			publishRaw(b, ac, topic, body, b.N, window)
			b.ResetTimer()
			ch, err := ac.Channel()
			if err != nil {
				b.Fatal(err)
			}
			defer ch.Close()
			if err := ch.Qos(benchWindow, 0, false); err != nil {
				b.Fatal(err)
			}
			dels, err := ch.Consume(topic+":raw", "", false, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			for i := 1; i <= b.N; i++ {
				d := <-dels
				if d.MessageId == "" {
					b.Fatal("a delivery without its message ID")
				}
				if i%consumeAckEvery == 0 || i == b.N {
					if err := d.Ack(true); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			benchkit.ReportRate(b, b.N)
		}})
	}
}

// BenchmarkLatency publishes 100-byte messages at a paced 1,000 msgs/s
// (b.Loop's iterations: -benchtime 3s is about 3,000 messages) while a
// consumer reads them, and reports the p50, p99 and largest
// publish→handler latency: an omnibus Publisher and Subscribe, and raw
// publishes on a confirm-mode channel (confirms not waited for) and
// basic.consume acking each delivery.
func BenchmarkLatency(b *testing.B) {
	benchkit.RunSides(b, "100B", benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		ctx := context.Background()
		c := open(ctx, b, "")
		topic, _ := benchTopology(b, ":bench") // groupQueue(topic, "bench")
		p := benchkit.Publisher(b, c)
		benchkit.Latency(b, c, topic, func(body []byte) error {
			_, err := p.Publish(ctx, topic, &omnibus.Message{Type: "bench", Body: body})
			return err
		}, omnibus.Group("bench"))
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
		topic, ac := benchTopology(b, ":raw")
		cch, err := ac.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer cch.Close()
		if err := cch.Qos(benchWindow, 0, false); err != nil {
			b.Fatal(err)
		}
		dels, err := cch.Consume(topic+":raw", "", false, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		r := benchkit.NewRecorder()
		consumed := make(chan struct{})
		go func() {
			defer close(consumed)
			for d := range dels {
				r.Received(d.Body)
				_ = d.Ack(false)
			}
		}()
		defer func() {
			_ = cch.Close()
			<-consumed
		}()
		pch, err := ac.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer pch.Close()
		if err := pch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		benchkit.MeasureLatency(b, r, func(body []byte) error {
			key, pub := rawPublishing(body)
			_, err := pch.PublishWithDeferredConfirm(topic, key, false, false, pub)
			return err
		})
	}})
}

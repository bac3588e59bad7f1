package rabbitbus

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
)

// benchWindow is the in-flight window both sides get: unconfirmed
// publishes, and the consumer's prefetch.
const benchWindow = 256

var benchSizes = []int{100, 1024}

// BenchmarkPublish publishes b.N persistent messages with publisher
// confirms through omnibus and through raw amqp091-go, in the same run on
// the same server and exchange, and reports both rates and their ratio.
// omnibus runs 4 publishers of 64-message batches (at most 256
// unconfirmed); raw keeps a sliding window of 256 deferred confirms.
func BenchmarkPublish(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(strconv.Itoa(size)+"B", func(b *testing.B) {
			ctx := context.Background()
			c := open(ctx, b, "")
			topic := fmt.Sprintf("omnibus-bench-pub-%x", rand.Uint32())
			ac, ch := rawChannel(b)
			defer ac.Close()
			if err := declareTopic(ch, topic); err != nil {
				b.Fatal(err)
			}
			q := topic + ":sink"
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				b.Fatal(err)
			}
			if err := ch.QueueBind(q, "#", topic, false, nil); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { deleteTopology(b, []string{"q:" + q, "x:" + topic}) })
			body := make([]byte, size)
			b.ResetTimer()
			omni := elapsed(func() { publishOmnibus(ctx, b, c, topic, body, b.N) })
			b.StopTimer()
			if _, err := ch.QueuePurge(q, false); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			raw := elapsed(func() { publishRaw(b, ac, topic, body, b.N) })
			b.StopTimer()
			_, _ = ch.QueuePurge(q, false)
			report(b, omni, raw, size)
		})
	}
}

// BenchmarkConsume consumes b.N messages with manual acks through omnibus
// (a no-op handler, MaxInFlight 256) and through raw amqp091-go (prefetch
// 256, one ack per message), each from its own queue filled beforehand
// with the same messages.
func BenchmarkConsume(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(strconv.Itoa(size)+"B", func(b *testing.B) {
			ctx := context.Background()
			c := open(ctx, b, "")
			topic := fmt.Sprintf("omnibus-bench-sub-%x", rand.Uint32())
			ac, ch := rawChannel(b)
			defer ac.Close()
			if err := declareTopic(ch, topic); err != nil {
				b.Fatal(err)
			}
			omniQ, rawQ := groupQueue(topic, "bench"), topic+":raw"
			for _, q := range []string{omniQ, rawQ} {
				if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: "classic"}); err != nil {
					b.Fatal(err)
				}
				if err := ch.QueueBind(q, "#", topic, false, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.Cleanup(func() { deleteTopology(b, []string{"q:" + omniQ, "q:" + rawQ, "x:" + topic}) })
			b.StopTimer()
			publishRaw(b, ac, topic, make([]byte, size), b.N) // fills both queues
			b.StartTimer()

			var n atomic.Int64
			done := make(chan struct{})
			start := time.Now()
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
			runDone := make(chan error, 1)
			go func() { runDone <- k.Run(rctx) }()
			<-done
			omni := time.Since(start)
			b.StopTimer()
			rcancel()
			<-runDone
			b.StartTimer()

			raw := elapsed(func() {
				rch, err := ac.Channel()
				if err != nil {
					b.Fatal(err)
				}
				defer rch.Close()
				if err := rch.Qos(benchWindow, 0, false); err != nil {
					b.Fatal(err)
				}
				dels, err := rch.Consume(rawQ, "", false, false, false, false, nil)
				if err != nil {
					b.Fatal(err)
				}
				for i := 0; i < b.N; i++ {
					d := <-dels
					if err := d.Ack(false); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.StopTimer()
			report(b, omni, raw, size)
		})
	}
}

func elapsed(fn func()) time.Duration {
	start := time.Now()
	fn()
	return time.Since(start)
}

func report(b *testing.B, omni, raw time.Duration, size int) {
	om, rm := float64(b.N)/omni.Seconds(), float64(b.N)/raw.Seconds()
	b.ReportMetric(om, "omnibus-msgs/s")
	b.ReportMetric(rm, "raw-msgs/s")
	b.ReportMetric(om*float64(size)/(1<<20), "omnibus-MiB/s")
	b.ReportMetric(om/rm, "ratio")
}

func publishOmnibus(ctx context.Context, b *testing.B, c *omnibus.Client, topic string, body []byte, n int) {
	const publishers, batch = 4, benchWindow / 4
	var left atomic.Int64
	left.Store(int64(n))
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
}

// publishRaw publishes n messages carrying what omnibus puts on the wire
// (message-id, type, timestamp, the CloudEvents headers), persistent,
// with a sliding window of benchWindow unconfirmed.
func publishRaw(b *testing.B, ac *amqp.Connection, topic string, body []byte, n int) {
	ch, err := ac.Channel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	window := make([]*amqp.DeferredConfirmation, 0, benchWindow)
	for i := range n {
		if len(window) == benchWindow {
			if ok, err := window[0].WaitContext(context.Background()); err != nil || !ok {
				b.Fatalf("confirm: ack=%v err=%v", ok, err)
			}
			window = window[1:]
		}
		id := omnibus.NewID()
		now := time.Now()
		dc, err := ch.PublishWithDeferredConfirm(topic, id, false, false, amqp.Publishing{
			Headers: amqp.Table{
				"cloudEvents:specversion": "1.0", "cloudEvents:id": id, "cloudEvents:type": "bench",
				"cloudEvents:time": now.UTC().Format(time.RFC3339Nano), hdrKeyless: true,
			},
			DeliveryMode: amqp.Persistent,
			MessageId:    id,
			Type:         "bench",
			Timestamp:    now,
			Body:         body,
		})
		if err != nil {
			b.Fatalf("publish %d: %v", i, err)
		}
		window = append(window, dc)
	}
	for _, dc := range window {
		if ok, err := dc.WaitContext(context.Background()); err != nil || !ok {
			b.Fatalf("confirm: ack=%v err=%v", ok, err)
		}
	}
}

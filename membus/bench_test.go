package membus_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/benchkit"
	"github.com/omnibus-go/omnibus/membus"
)

func newClient(b *testing.B) *omnibus.Client {
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 8}).Conn())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// BenchmarkPublish reports msgs/s and allocations per message for
// single-message and batched publishes of 100-byte messages.
func BenchmarkPublish(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run("batch="+strconv.Itoa(batch), func(b *testing.B) {
			c := newClient(b)
			ms := make([]*omnibus.Message, batch)
			body := make([]byte, 100)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i += batch {
				for j := range ms {
					ms[j] = &omnibus.Message{Key: strconv.Itoa(j), Body: body}
				}
				if err := c.Publish(context.Background(), "bench", ms...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkConsume reports msgs/s and allocations per message for the
// engine reading a backlog of 100-byte messages with a no-op handler.
func BenchmarkConsume(b *testing.B) {
	c := newClient(b)
	body := make([]byte, 100)
	var ms []*omnibus.Message
	for i := range b.N {
		ms = append(ms, &omnibus.Message{Key: strconv.Itoa(i % 1000), Body: body})
		if len(ms) == 1000 || i == b.N-1 {
			if err := c.Publish(context.Background(), "bench", ms...); err != nil {
				b.Fatal(err)
			}
			ms = ms[:0]
		}
	}
	var n atomic.Int64
	done := make(chan struct{})
	k, err := c.Subscribe(context.Background(), "bench", func(context.Context, *omnibus.Message) error {
		if n.Add(1) == int64(b.N) {
			close(done)
		}
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	go k.Run(context.Background())
	<-done
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	k.Close()
}

// BenchmarkLatency publishes 100-byte messages at a paced 1,000 msgs/s
// (b.Loop's iterations: -benchtime 3s is about 3,000 messages) through a
// Publisher while a consumer reads them, and reports the p50, p99 and
// largest publish→handler latency: the engine's own, with no network
// (omnibus only; there is no raw client to compare with).
func BenchmarkLatency(b *testing.B) {
	b.Run("omnibus/100B", func(b *testing.B) {
		c := newClient(b)
		p := benchkit.Publisher(b, c)
		seq := 0
		benchkit.Latency(b, c, "latency", func(body []byte) error {
			seq++
			_, err := p.Publish(context.Background(), "latency", &omnibus.Message{Key: "key-" + strconv.Itoa(seq%64), Body: body})
			return err
		}, omnibus.StartFrom(omnibus.StartEarliest))
	})
}

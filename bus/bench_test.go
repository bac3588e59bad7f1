package bus_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// BenchmarkLatency measures, one message at a time, on each transport:
//
//	raw      omnibus Publish to the handler's start (one hop, no bus)
//	send     bus Send to the typed handler's start (one hop through the bus)
//	request  bus Request until its reply returns (two hops: command and reply)
//
// and reports p50 and p99 in microseconds. What the bus adds is send
// against raw; a request costs about two sends.
func BenchmarkLatency(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			ns := namespace()
			rawURL := tr.url(b, ns)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()

			b.Run("raw", func(b *testing.B) {
				c := transporttest.Open(b, rawURL)
				topic := ns + ".raw"
				if err := c.CreateTopic(ctx, topic, 4); err != nil {
					b.Fatal(err)
				}
				got := make(chan time.Time, 1)
				consume(b, ctx, c, topic, "raw", func(ctx context.Context, m *omnibus.Message) error {
					got <- time.Now()
					return nil
				})
				pub := transporttest.Open(b, rawURL)
				measure(b, func() time.Duration {
					t0 := time.Now()
					if err := pub.Publish(ctx, topic, &omnibus.Message{Key: "k", Body: []byte(`{"order":"o"}`)}); err != nil {
						b.Fatal(err)
					}
					return (<-got).Sub(t0)
				})
			})

			got := make(chan time.Time, 1)
			billing, err := bus.New(transporttest.Open(b, rawURL), "billing", bus.Namespace(ns))
			must(b, err)
			must(b, bus.HandleCommand(billing, func(ctx context.Context, inv bus.Invocation, c ChargeCard) error {
				if c.Order == "send" {
					got <- time.Now()
					return nil
				}
				return inv.Reply(ctx, Charged{Order: c.Order})
			}))
			orders, err := bus.New(transporttest.Open(b, rawURL), "orders", bus.Namespace(ns))
			must(b, err)
			start(b, ctx, billing)
			start(b, ctx, orders)

			b.Run("send", func(b *testing.B) {
				measure(b, func() time.Duration {
					t0 := time.Now()
					must(b, orders.Send(ctx, "billing", ChargeCard{Order: "send"}))
					return (<-got).Sub(t0)
				})
			})
			b.Run("request", func(b *testing.B) {
				measure(b, func() time.Duration {
					rctx, cancel := context.WithTimeout(ctx, time.Minute)
					defer cancel()
					t0 := time.Now()
					if _, err := bus.Request[Charged](rctx, orders, "billing", ChargeCard{Order: "request"}); err != nil {
						b.Fatal(err)
					}
					return time.Since(t0)
				})
			})
		})
	}
}

// measure runs one b.N times after a warm-up and reports p50 and p99.
func measure(b *testing.B, one func() time.Duration) {
	for range 20 {
		one()
	}
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		lat = append(lat, one())
	}
	b.StopTimer()
	slices.Sort(lat)
	us := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(us(0.50), "p50-µs")
	b.ReportMetric(us(0.99), "p99-µs")
}

package omnibus_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/membus"
	"github.com/omnibus-go/omnibus/otelomnibus"
	"github.com/omnibus-go/omnibus/promomnibus"
)

// publishBacklog publishes n messages of size bytes over keys keys.
func publishBacklog(b *testing.B, c *omnibus.Client, topic string, n, keys, size int) {
	b.Helper()
	body := make([]byte, size)
	const batch = 1000
	ms := make([]*omnibus.Message, 0, batch)
	for i := 0; i < n; i += batch {
		ms = ms[:0]
		for j := i; j < min(n, i+batch); j++ {
			ms = append(ms, &omnibus.Message{ID: strconv.Itoa(j), Key: "k" + strconv.Itoa(j%keys), Body: body})
		}
		if err := c.Publish(context.Background(), topic, ms...); err != nil {
			b.Fatal(err)
		}
	}
}

// consume runs a consumer over the backlog until n messages are handled.
func consume(b *testing.B, c *omnibus.Client, topic string, n int, h func(), opts ...omnibus.SubscribeOption) {
	b.Helper()
	var done atomic.Int64
	finished := make(chan struct{})
	k, err := c.Subscribe(context.Background(), topic, func(ctx context.Context, m *omnibus.Message) error {
		h()
		if done.Add(1) == int64(n) {
			close(finished)
		}
		return nil
	}, append(opts, omnibus.StartFrom(omnibus.StartEarliest))...)
	if err != nil {
		b.Fatal(err)
	}
	go k.Run(context.Background())
	<-finished
	b.StopTimer()
	k.Close()
}

// BenchmarkOrdering compares the ordering modes with a handler that takes
// 1 ms, on 4 lanes and 1,000 keys, at several in-flight bounds: key mode
// lifts throughput past the lane count, lane mode cannot.
func BenchmarkOrdering(b *testing.B) {
	for _, mode := range []omnibus.Ordering{omnibus.OrderLane, omnibus.OrderKey, omnibus.OrderNone} {
		for _, conc := range []int{1, 16, 64, 256} {
			b.Run(fmt.Sprintf("mode=%s/concurrency=%d", mode, conc), func(b *testing.B) {
				c := benchClient(b, 4)
				publishBacklog(b, c, "bench", b.N, 1000, 100)
				b.ResetTimer()
				start := time.Now()
				consume(b, c, "bench", b.N, func() { time.Sleep(time.Millisecond) }, omnibus.Order(mode), omnibus.MaxInFlight(conc))
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			})
		}
	}
}

// BenchmarkNoopHandler measures the engine's own cost per message: a
// handler that does nothing, allocations per message included.
func BenchmarkNoopHandler(b *testing.B) {
	for _, mode := range []omnibus.Ordering{omnibus.OrderLane, omnibus.OrderKey, omnibus.OrderNone} {
		b.Run("mode="+mode.String(), func(b *testing.B) {
			c := benchClient(b, 4)
			publishBacklog(b, c, "bench", b.N, 1000, 100)
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			consume(b, c, "bench", b.N, func() {}, omnibus.Order(mode), omnibus.MaxInFlight(256))
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkPublisher publishes b.N messages of 100 bytes over 64 keys
// with Publisher.Publish from one goroutine, keeping every result, then
// Flush: what the asynchronous publisher costs per message over membus,
// allocations included.
func BenchmarkPublisher(b *testing.B) {
	c := benchClient(b, 4)
	p, err := c.Publisher()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	body := make([]byte, 100)
	ms := make([]*omnibus.Message, b.N)
	for i := range ms {
		ms[i] = &omnibus.Message{Key: "k" + strconv.Itoa(i%64), Body: body}
	}
	results := make([]*omnibus.PublishResult, b.N)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i, m := range ms {
		if results[i], err = p.Publish(context.Background(), "bench", m); err != nil {
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
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// noopHook is a hook of every kind that does nothing.
type noopHook struct{}

func (noopHook) OnHandle(ctx context.Context, _ string, _ []*omnibus.Message) (context.Context, func(error)) {
	return ctx, nil
}
func (noopHook) OnFetch(omnibus.FetchInfo)  {}
func (noopHook) OnSettle(omnibus.Event)     {}
func (noopHook) OnRetry(omnibus.Event)      {}
func (noopHook) OnDeadLetter(omnibus.Event) {}
func (noopHook) OnCommit(omnibus.Event)     {}
func (noopHook) OnLanes(omnibus.Event)      {}

// BenchmarkHooks is BenchmarkNoopHandler in key mode without hooks, with
// a hook of every kind that does nothing, with the Prometheus collector
// and with the OpenTelemetry hook (the SDK's tracer and meter, spans
// recorded and dropped): what hooks cost per message, allocations
// included (none added without hooks). The Prometheus collector is
// scraped once at the end, outside the timing.
func BenchmarkHooks(b *testing.B) {
	hooks := []struct {
		name string
		make func(b *testing.B) omnibus.Hook
	}{
		{"none", nil},
		{"every-kind", func(*testing.B) omnibus.Hook { return noopHook{} }},
		{"prometheus", func(b *testing.B) omnibus.Hook {
			col := promomnibus.New()
			reg := prometheus.NewRegistry()
			reg.MustRegister(col)
			b.Cleanup(func() {
				if _, err := reg.Gather(); err != nil {
					b.Error(err)
				}
			})
			return col
		}},
		{"opentelemetry", func(b *testing.B) omnibus.Hook {
			tp := sdktrace.NewTracerProvider()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
			h, err := otelomnibus.New(otelomnibus.WithTracerProvider(tp), otelomnibus.WithMeterProvider(mp))
			if err != nil {
				b.Fatal(err)
			}
			return h
		}},
	}
	for _, h := range hooks {
		b.Run("hooks="+h.name, func(b *testing.B) {
			c := benchClient(b, 4)
			publishBacklog(b, c, "bench", b.N, 1000, 100)
			opts := []omnibus.SubscribeOption{omnibus.Order(omnibus.OrderKey), omnibus.MaxInFlight(256)}
			if h.make != nil {
				opts = append(opts, omnibus.Hooks(h.make(b)))
			}
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			consume(b, c, "bench", b.N, func() {}, opts...)
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// BenchmarkDrainBacklog drains 200,000 messages of 1 KiB with an in-flight
// bound of 1,000 and reports the peak live heap above what the backlog
// itself holds: it stays near the bound's worth, whatever the backlog's
// size. The collector runs often (GOGC=5) so the live-heap samples are
// many.
func BenchmarkDrainBacklog(b *testing.B) {
	const n, size, inflight = 200_000, 1024, 1000
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	readLive := func() uint64 {
		metrics.Read(live)
		return live[0].Value.Uint64()
	}
	for range b.N {
		b.StopTimer()
		c := benchClient(b, 4)
		publishBacklog(b, c, "backlog", n, 1000, size)
		runtime.GC()
		base := readLive()
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				if v := readLive(); v > peak.Load() {
					peak.Store(v)
				}
			}
		}()
		b.StartTimer()
		start := time.Now()
		consume(b, c, "backlog", n, func() {}, omnibus.MaxInFlight(inflight))
		elapsed := time.Since(start)
		close(stop)
		<-sampled
		extra := float64(0)
		if p := peak.Load(); p > base {
			extra = float64(p-base) / (1 << 20)
		}
		b.ReportMetric(extra, "peak-live-heap-above-backlog-MiB")
		b.ReportMetric(float64(base)/(1<<20), "backlog-heap-MiB")
		b.ReportMetric(float64(inflight*size)/(1<<20), "in-flight-bound-MiB")
		b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
		c.Close()
	}
}

func benchClient(b *testing.B, partitions int) *omnibus.Client {
	b.Helper()
	c, err := omnibus.New(membus.New(membus.Config{Partitions: partitions}).Conn(), quiet())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

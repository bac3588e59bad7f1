package redisbus_test

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/benchkit"
	"github.com/omnibus-go/omnibus/transporttest"
)

// Benchmarks run omnibus and raw go-redis side by side against the same
// server in one run and report both rates and their ratio:
//
//	go test -run '^$' -bench . -benchtime 20000x ./redisbus/

const benchBatch = 100

// benchWindow is the consume benchmark's window, the same on both sides:
// omnibus.MaxInFlight for omnibus, the XREADGROUP COUNT for raw go-redis.
const benchWindow = 1024

// rawPublish publishes n messages as redisbus does: XADD pipelined in
// batches, with the same fields (the CloudEvents attributes omnibus
// sends), so both sides move the same bytes.
func rawPublish(b *testing.B, rdb *redis.Client, stream string, n int, body []byte) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += benchBatch {
		pipe := rdb.Pipeline()
		for j := i; j < min(n, i+benchBatch); j++ {
			id := omnibus.NewID()
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
				"ce_specversion", "1.0", "ce_id", id, "ce_time", time.Now().UTC().Format(time.RFC3339Nano), "data", body}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
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

func report(b *testing.B, n int, omni, raw side) {
	o := float64(n) / omni.wall.Seconds()
	r := float64(n) / raw.wall.Seconds()
	b.ReportMetric(o, "omnibus-msgs/s")
	b.ReportMetric(r, "raw-msgs/s")
	b.ReportMetric(o/r, "ratio")
	b.ReportMetric(float64(omni.cpu.Microseconds())/float64(n), "omnibus-cpu-us/msg")
	b.ReportMetric(float64(raw.cpu.Microseconds())/float64(n), "raw-cpu-us/msg")
	b.ReportMetric(0, "ns/op")
}

// segments is how many parts each side's b.N is split into. They run in
// the order omnibus, raw, raw, omnibus, omnibus, raw, ..., so that a
// drift of the shared machine over the run (other processes, the
// server's memory) weighs on both sides alike.
const segments = 4

// side is one side's totals over its segments: the time they took, and
// the CPU time the process spent meanwhile (the client's work, not the
// server's: a measure the machine's other load does not change much).
type side struct {
	wall, cpu time.Duration
}

// alternate runs omni and raw on segments parts of n each, alternating,
// and returns each side's totals and the count of messages per side.
func alternate(n int, omni, raw func(seg, n int) time.Duration) (o, r side, total int) {
	part := max(1, n/segments)
	run := func(s *side, fn func(seg, n int) time.Duration, seg int) {
		before := benchkit.CPUTime()
		s.wall += fn(seg, part)
		s.cpu += benchkit.CPUTime() - before
	}
	for seg := range segments {
		if seg%2 == 0 {
			run(&o, omni, seg)
			run(&r, raw, seg)
		} else {
			run(&r, raw, seg)
			run(&o, omni, seg)
		}
	}
	return o, r, part * segments
}

// BenchmarkPublish publishes b.N messages on each side, alternating.
func BenchmarkPublish(b *testing.B) {
	u := serverURL(b)
	for _, size := range []int{100, 1024} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			body := make([]byte, size)
			c := transporttest.Open(b, u)
			rdb := raw(b, u)
			topic := topicName(b, u)
			rawName := topic + "-raw"
			omnibusPublish(b, c, topic, benchBatch, body) // warm up
			rawPublish(b, rdb, rawName, benchBatch, body)
			timed := func(publish func()) time.Duration {
				debug.FreeOSMemory()
				start := time.Now()
				publish()
				return time.Since(start)
			}
			b.ResetTimer()
			omni, raw, n := alternate(b.N,
				func(_, n int) time.Duration { return timed(func() { omnibusPublish(b, c, topic, n, body) }) },
				func(_, n int) time.Duration { return timed(func() { rawPublish(b, rdb, rawName, n, body) }) })
			b.StopTimer()
			report(b, n, omni, raw)
		})
	}
}

// BenchmarkConsume consumes b.N messages on each side, alternating, each
// segment from a stream of its own.
func BenchmarkConsume(b *testing.B) {
	u := serverURL(b)
	for _, size := range []int{100, 1024} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			body := make([]byte, size)
			c := transporttest.Open(b, u)
			rdb := raw(b, u)
			topic := topicName(b, u)
			part := max(1, b.N/segments)
			for seg := range segments { // topicName's cleanup deletes them all
				omnibusPublish(b, c, fmt.Sprintf("%s-%d", topic, seg), part, body)
				rawPublish(b, rdb, fmt.Sprintf("%s-raw%d", topic, seg), part, body)
			}
			b.ResetTimer()
			omni, raw, n := alternate(b.N,
				func(seg, n int) time.Duration { return consumeOmnibus(b, c, fmt.Sprintf("%s-%d", topic, seg), n) },
				func(seg, n int) time.Duration { return consumeRaw(b, rdb, fmt.Sprintf("%s-raw%d", topic, seg), n) })
			b.StopTimer()
			report(b, n, omni, raw)
		})
	}
}

// consumeOmnibus reads n messages of topic with a consumer group,
// unordered, and returns the time it took.
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

// consumeRaw reads n messages of stream as a consumer of a new group
// does with go-redis: XREADGROUP of benchWindow entries, the message ID
// of each, and one XACK per read. It starts with the memory of what ran
// before given back, as consumeOmnibus does.
func consumeRaw(b *testing.B, rdb *redis.Client, stream string, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	debug.FreeOSMemory()
	start := time.Now()
	if err := rdb.XGroupCreate(ctx, stream, "bench", "0").Err(); err != nil {
		b.Fatal(err)
	}
	for got := 0; got < n; {
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "bench", Consumer: "raw",
			Streams: []string{stream, ">"}, Count: benchWindow, Block: time.Second}).Result()
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]string, 0, benchWindow)
		for _, st := range res {
			for _, m := range st.Messages {
				if m.Values["ce_id"] == nil {
					b.Fatal("no message ID")
				}
				ids = append(ids, m.ID)
			}
		}
		if err := rdb.XAck(ctx, stream, "bench", ids...).Err(); err != nil {
			b.Fatal(err)
		}
		got += len(ids)
	}
	return time.Since(start)
}

// BenchmarkLatency publishes 100-byte messages at a paced 1,000 msgs/s
// (b.Loop's iterations: -benchtime 3s is about 3,000 messages) while a
// group consumer reads them, and reports the p50, p99 and largest
// publish→handler latency: omnibus's Subscribe fed by a Publisher
// ("omnibus") or by Client.Publish ("omnibus-sync"), and go-redis's
// XADD per message with a consumer looping on a blocking XREADGROUP and
// acknowledging each read with one XACK. XADD, like Client.Publish,
// waits for its answer on the caller's goroutine; a Publisher hands
// each message to a sender goroutine, which waits there.
func BenchmarkLatency(b *testing.B) {
	u := serverURL(b)
	benchkit.RunSides(b, "100B", benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		c := transporttest.Open(b, u)
		topic := topicName(b, u)
		p := benchkit.Publisher(b, c)
		benchkit.Latency(b, c, topic, func(body []byte) error {
			_, err := p.Publish(context.Background(), topic, &omnibus.Message{Body: body})
			return err
		}, omnibus.Group("bench"), omnibus.StartFrom(omnibus.StartEarliest))
	}}, benchkit.Side{Name: "omnibus-sync", Run: func(b *testing.B) {
		c := transporttest.Open(b, u)
		topic := topicName(b, u)
		benchkit.Latency(b, c, topic, func(body []byte) error {
			return c.Publish(context.Background(), topic, &omnibus.Message{Body: body})
		}, omnibus.Group("bench"), omnibus.StartFrom(omnibus.StartEarliest))
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
		rdb := raw(b, u)
		stream := topicName(b, u) + "-raw" // topicName's cleanup deletes it
		ctx, cancel := context.WithCancel(context.Background())
		if err := rdb.XGroupCreateMkStream(ctx, stream, "bench", "0").Err(); err != nil {
			b.Fatal(err)
		}
		r := benchkit.NewRecorder()
		read := make(chan error, 1)
		go func() {
			for ctx.Err() == nil {
				res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "bench", Consumer: "raw",
					Streams: []string{stream, ">"}, Count: benchWindow, Block: 100 * time.Millisecond}).Result()
				if errors.Is(err, redis.Nil) {
					continue
				}
				if err != nil {
					read <- err
					return
				}
				var ids []string
				for _, st := range res {
					for _, m := range st.Messages {
						body, _ := m.Values["data"].(string)
						r.Received([]byte(body))
						ids = append(ids, m.ID)
					}
				}
				if err := rdb.XAck(ctx, stream, "bench", ids...).Err(); err != nil {
					read <- err
					return
				}
			}
			read <- nil
		}()
		benchkit.MeasureLatency(b, r, func(body []byte) error {
			return rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{
				"ce_specversion", "1.0", "ce_id", omnibus.NewID(), "ce_time", time.Now().UTC().Format(time.RFC3339Nano), "data", body}}).Err()
		})
		cancel()
		if err := <-read; err != nil && ctx.Err() == nil {
			b.Errorf("XREADGROUP: %v", err)
		}
	}})
}

package nsqbus_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"runtime/debug"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/benchkit"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// Benchmarks run omnibus and raw go-nsq side by side against the same
// nsqd in one run and report both rates and their ratio:
//
//	go test -run '^$' -bench . -benchtime 20000x ./nsqbus/
//
// The raw side is go-nsq as its users write it: a Producer's
// MultiPublish of plain bodies, and a Consumer whose handler returns nil
// (go-nsq sends FIN). omnibus's messages carry more (the CloudEvents
// envelope: ID, time, the body in base64), which is part of what is
// measured; the binary-* cases publish in the binary envelope
// (envelope=binary), which carries the body as it is. Beside the rates
// (msgs/s and their ratio) each side reports its processor time per
// message, this process and nsqd together
// (cpu-us/msg, nsqd's share as nsqd-cpu-us/msg), and cpu-ratio, raw's
// over omnibus's: on a machine whose cores other work shares, it varies
// less than the rates.

const benchBatch = 100

// benchSizes are the benchmarks' cases: a body size, and omnibus's URL
// parameters (the envelope). Raw go-nsq sends the same bodies in each.
var benchSizes = []struct {
	name   string
	bytes  int
	params []string
}{
	{"100B", 100, nil},
	{"1024B", 1024, nil},
	{"binary-100B", 100, []string{"envelope=binary"}},
	{"binary-1024B", 1024, []string{"envelope=binary"}},
}

// benchWindow is the consume benchmark's in-flight window, the same on
// both sides: omnibus.MaxInFlight, and go-nsq's max_in_flight.
const benchWindow = 1024

// benchServer starts an nsqd of the benchmark's own that keeps its
// topics and channels in memory, so that what is measured is the
// clients and the protocol, not the disk (nsqd writes beyond
// mem-queue-size, and a publish benchmark builds a backlog).
func benchServer(b *testing.B) *nsqtest.NSQD {
	return nsqtest.StartNSQD(b, nsqtest.Config{MemQueueSize: 1 << 20})
}

// cost is what one side's run took: wall-clock time, and the processor
// time of this process and of nsqd together. Client and server share
// the machine's cores with whatever else runs, so the processor time
// per message is the steadier measure of what each side costs; the
// benchmark reports both.
type cost struct {
	wall, cpu, server time.Duration // server: nsqd's share of cpu
}

func (c cost) add(o cost) cost { return cost{c.wall + o.wall, c.cpu + o.cpu, c.server + o.server} }

// measure runs fn, which returns the wall-clock time of its measured
// part, and adds the processor time this process and n used meanwhile.
func measure(n *nsqtest.NSQD, fn func() time.Duration) cost {
	debug.FreeOSMemory()
	self, server := benchkit.CPUTime(), n.CPU()
	wall := fn()
	server = n.CPU() - server
	return cost{wall: wall, cpu: benchkit.CPUTime() - self + server, server: server}
}

func report(b *testing.B, n int, omni, raw cost) {
	o := float64(n) / omni.wall.Seconds()
	r := float64(n) / raw.wall.Seconds()
	b.ReportMetric(o, "omnibus-msgs/s")
	b.ReportMetric(r, "raw-msgs/s")
	b.ReportMetric(o/r, "ratio")
	oc := float64(omni.cpu.Microseconds()) / float64(n)
	rc := float64(raw.cpu.Microseconds()) / float64(n)
	b.ReportMetric(oc, "omnibus-cpu-us/msg")
	b.ReportMetric(rc, "raw-cpu-us/msg")
	b.ReportMetric(rc/oc, "cpu-ratio")
	b.ReportMetric(float64(omni.server.Microseconds())/float64(n), "omnibus-nsqd-cpu-us/msg")
	b.ReportMetric(float64(raw.server.Microseconds())/float64(n), "raw-nsqd-cpu-us/msg")
	b.ReportMetric(0, "ns/op")
}

func rawProducer(b *testing.B, addr string) *nsq.Producer {
	b.Helper()
	p, err := nsq.NewProducer(addr, nsq.NewConfig())
	if err != nil {
		b.Fatal(err)
	}
	p.SetLoggerLevel(nsq.LogLevelError)
	b.Cleanup(p.Stop)
	return p
}

func rawPublish(b *testing.B, p *nsq.Producer, topic string, n int, body []byte) {
	b.Helper()
	bodies := make([][]byte, benchBatch)
	for i := 0; i < n; i += benchBatch {
		bodies = bodies[:min(benchBatch, n-i)]
		for j := range bodies {
			bodies[j] = body
		}
		if err := p.MultiPublish(topic, bodies); err != nil {
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

// benchTopic returns a fresh topic name, deleted (with the topics named
// after it) when b ends.
func benchTopic(b *testing.B, n *nsqtest.NSQD, suffixes ...string) string {
	topic := fmt.Sprintf("bench-%x", rand.Uint32())
	b.Cleanup(func() {
		for _, s := range append([]string{""}, suffixes...) {
			_ = nsqtest.Post(n.HTTPAddr(), "/topic/delete", url.Values{"topic": {topic + s}})
		}
	})
	return topic
}

// BenchmarkPublish publishes b.N messages on each side, in the order
// omnibus, raw, raw, omnibus (b.N/2 each time), so that a drift of the
// shared machine weighs on both sides alike.
func BenchmarkPublish(b *testing.B) {
	n := benchServer(b)
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			body := make([]byte, size.bytes)
			c := transporttest.Open(b, n.URL(size.params...))
			p := rawProducer(b, n.TCPAddr())
			topic := benchTopic(b, n, "-raw")
			half := max(1, b.N/2)
			// Warm up with as many messages as are measured, on both
			// sides: nsqd keeps what is published (the topics have no
			// channel), and while its heap is small it collects often
			// and takes fresh memory from the system, so the side
			// measured first paid several times nsqd's processor time
			// per message (5 us at 100 B against 0.5-1 for the same
			// side measured second; the ratio at 100 B was 0.25-0.55
			// with omnibus first and 1.3-2.3 with raw go-nsq first).
			omnibusPublish(b, c, topic, half, body)
			rawPublish(b, p, topic+"-raw", half, body)
			timed := func(publish func()) func() time.Duration {
				return func() time.Duration {
					start := time.Now()
					publish()
					return time.Since(start)
				}
			}
			omniRun := timed(func() { omnibusPublish(b, c, topic, half, body) })
			rawRun := timed(func() { rawPublish(b, p, topic+"-raw", half, body) })
			b.ResetTimer()
			omni := measure(n, omniRun)
			raw := measure(n, rawRun).add(measure(n, rawRun))
			omni = omni.add(measure(n, omniRun))
			b.StopTimer()
			report(b, 2*half, omni, raw)
		})
	}
}

// BenchmarkConsume measures in the order omnibus, raw, raw, omnibus,
// each on a topic of its own holding b.N/2 messages, and adds up each
// side's time. Both sides have nsqd buffer what it writes to them as
// go-nsq's defaults ask (16 KiB, flushed every 250ms): omnibus's
// default, no buffer, costs nsqd a write per message.
func BenchmarkConsume(b *testing.B) {
	n := benchServer(b)
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			body := make([]byte, size.bytes)
			c := transporttest.Open(b, n.URL(slices.Concat(size.params, []string{"output_buffer_size=16384"})...))
			p := rawProducer(b, n.TCPAddr())
			topic := benchTopic(b, n, "-1", "-2", "-raw1", "-raw2")
			half := max(1, b.N/2)
			// A channel made before publishing keeps the messages for the
			// group (the first channel of a topic would get them anyway).
			for _, t := range []string{"-1", "-2"} {
				createChannel(b, n, topic+t, "bench")
				omnibusPublish(b, c, topic+t, half, body)
			}
			for _, t := range []string{"-raw1", "-raw2"} {
				createChannel(b, n, topic+t, "bench")
				rawPublish(b, p, topic+t, half, body)
			}
			b.ResetTimer()
			omni := measure(n, func() time.Duration { return consumeOmnibus(b, c, topic+"-1", half) })
			raw := measure(n, func() time.Duration { return consumeRaw(b, n.TCPAddr(), topic+"-raw1", half) })
			raw = raw.add(measure(n, func() time.Duration { return consumeRaw(b, n.TCPAddr(), topic+"-raw2", half) }))
			omni = omni.add(measure(n, func() time.Duration { return consumeOmnibus(b, c, topic+"-2", half) }))
			b.StopTimer()
			report(b, 2*half, omni, raw)
		})
	}
}

// consumeOmnibus reads n messages of topic with group "bench", unordered,
// and returns the time it took.
func consumeOmnibus(b *testing.B, c *omnibus.Client, topic string, n int) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	var got atomic.Int64
	done := make(chan struct{})
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error {
		if got.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}, omnibus.Group("bench"), omnibus.MaxInFlight(benchWindow))
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = k.Run(ctx) }()
	<-done
	d := time.Since(start)
	_ = k.Shutdown(ctx)
	return d
}

// consumeRaw reads n messages of topic with a go-nsq Consumer of channel
// "bench", max_in_flight benchWindow, a handler that returns nil (go-nsq
// sends FIN), and returns the time it took. It reads what omnibus hands
// a handler: the message ID and the attempt count.
func consumeRaw(b *testing.B, addr, topic string, n int) time.Duration {
	b.Helper()
	start := time.Now()
	cfg := nsq.NewConfig()
	cfg.MaxInFlight = benchWindow
	cons, err := nsq.NewConsumer(topic, "bench", cfg)
	if err != nil {
		b.Fatal(err)
	}
	cons.SetLoggerLevel(nsq.LogLevelError)
	var got atomic.Int64
	done := make(chan struct{})
	cons.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		if m.ID[0] == 0 || m.Attempts == 0 {
			b.Error("no message ID or attempt count")
		}
		if got.Add(1) == int64(n) {
			close(done)
		}
		return nil
	}))
	if err := cons.ConnectToNSQD(addr); err != nil {
		b.Fatal(err)
	}
	<-done
	d := time.Since(start)
	cons.Stop()
	<-cons.StopChan
	return d
}

// createChannel creates channel on topic on n.
func createChannel(b *testing.B, n *nsqtest.NSQD, topic, channel string) {
	b.Helper()
	for _, path := range []string{"/topic/create", "/channel/create"} {
		if err := postNSQD(n.HTTPAddr(), path, topic, channel); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLatency publishes 100-byte messages at a paced 1,000 msgs/s
// (b.Loop's iterations: -benchtime 3s is about 3,000 messages) while a
// group consumer reads them, and reports the p50, p99 and largest
// publish→handler latency: omnibus's Subscribe fed by a Publisher
// ("omnibus") or by Client.Publish ("omnibus-sync"), and a
// go-nsq Producer's Publish per message (which waits for nsqd's answer,
// as Client.Publish does) with a Consumer of
// max_in_flight 256 (omnibus's default MaxInFlight) whose handler
// returns nil. Both consumers ask nsqd for no output buffer, omnibus's
// default; with go-nsq's (16 KiB, flushed every 250ms) a message at
// this rate waits for the buffer to fill or the timer: p50 about 60 ms
// for raw go-nsq, 28 ms for omnibus's larger messages.
func BenchmarkLatency(b *testing.B) {
	n := benchServer(b)
	benchkit.RunSides(b, "100B", benchkit.Side{Name: "omnibus", Run: func(b *testing.B) {
		c := transporttest.Open(b, n.URL())
		topic := benchTopic(b, n)
		p := benchkit.Publisher(b, c)
		benchkit.Latency(b, c, topic, func(body []byte) error {
			_, err := p.Publish(context.Background(), topic, &omnibus.Message{Body: body})
			return err
		}, omnibus.Group("bench"))
	}}, benchkit.Side{Name: "omnibus-sync", Run: func(b *testing.B) {
		c := transporttest.Open(b, n.URL())
		topic := benchTopic(b, n)
		benchkit.Latency(b, c, topic, func(body []byte) error {
			return c.Publish(context.Background(), topic, &omnibus.Message{Body: body})
		}, omnibus.Group("bench"))
	}}, benchkit.Side{Name: "raw", Run: func(b *testing.B) {
		topic := benchTopic(b, n)
		p := rawProducer(b, n.TCPAddr())
		createChannel(b, n, topic, "bench")
		cfg := nsq.NewConfig()
		cfg.MaxInFlight = 256
		cfg.OutputBufferSize = -1
		cons, err := nsq.NewConsumer(topic, "bench", cfg)
		if err != nil {
			b.Fatal(err)
		}
		cons.SetLoggerLevel(nsq.LogLevelError)
		r := benchkit.NewRecorder()
		cons.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
			r.Received(m.Body)
			return nil
		}))
		if err := cons.ConnectToNSQD(n.TCPAddr()); err != nil {
			b.Fatal(err)
		}
		defer func() {
			cons.Stop()
			<-cons.StopChan
		}()
		benchkit.MeasureLatency(b, r, func(body []byte) error { return p.Publish(topic, body) })
	}})
}

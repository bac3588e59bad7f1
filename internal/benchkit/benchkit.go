// Package benchkit holds what the transports' benchmarks share: sides
// run in an order that alternates between runs (omnibus and the raw
// client), rates, and publish→handler latencies at a paced rate.
package benchkit

import (
	"context"
	"encoding/binary"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
)

// Side is one side of a comparison: omnibus, or the raw client.
type Side struct {
	Name string
	Run  func(b *testing.B)
}

// RunSides runs the sides as sub-benchmarks <side>/<size>, in the order
// given, or reversed when OMNIBUS_BENCH_RAW_FIRST is set (scripts/bench.sh
// sets it every other round, so that neither side always runs first).
func RunSides(b *testing.B, size string, sides ...Side) {
	if os.Getenv("OMNIBUS_BENCH_RAW_FIRST") != "" {
		slices.Reverse(sides)
	}
	for _, s := range sides {
		b.Run(s.Name+"/"+size, s.Run)
	}
}

// ReportRate reports n messages over the benchmark's time as msgs/s.
func ReportRate(b *testing.B, n int) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

// Recorder collects publish→handler latencies. A message's body
// carries its publish time (Unix nanoseconds) and a warm-up flag.
type Recorder struct {
	warm     chan struct{} // closed when a warm-up message arrives
	warmOnce sync.Once
	mu       sync.Mutex
	lat      []time.Duration
}

func NewRecorder() *Recorder { return &Recorder{warm: make(chan struct{})} }

// LatencyMessage is a 100-byte body stamped with the time now.
func LatencyMessage(warm bool) []byte {
	body := make([]byte, 100)
	binary.BigEndian.PutUint64(body, uint64(time.Now().UnixNano()))
	if warm {
		body[8] = 1
	}
	return body
}

// Received records the latency of a body a consumer got.
func (r *Recorder) Received(body []byte) {
	if len(body) < 9 {
		return
	}
	d := time.Duration(time.Now().UnixNano() - int64(binary.BigEndian.Uint64(body)))
	if body[8] == 1 {
		r.warmOnce.Do(func() { close(r.warm) })
		return
	}
	r.mu.Lock()
	r.lat = append(r.lat, d)
	r.mu.Unlock()
}

func (r *Recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lat)
}

// MeasureLatency sends warm-up messages until one arrives (the consumer
// is then in place), then one message per b.Loop iteration at a paced
// 1,000 msgs/s; it waits for them all and reports the p50, p99 and
// largest latency in milliseconds.
func MeasureLatency(b *testing.B, r *Recorder, send func(body []byte) error) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for ready := false; !ready; {
		if err := send(LatencyMessage(true)); err != nil {
			b.Fatal(err)
		}
		select {
		case <-r.warm:
			ready = true
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				b.Fatal("no warm-up message arrived within a minute")
			}
		}
	}
	sent := 0
	var start time.Time
	for b.Loop() {
		if sent == 0 {
			start = time.Now()
		}
		if d := time.Until(start.Add(time.Duration(sent) * time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
		if err := send(LatencyMessage(false)); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	for deadline := time.Now().Add(time.Minute); r.count() < sent; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages arrived within a minute", r.count(), sent)
		}
	}
	r.mu.Lock()
	lat := slices.Clone(r.lat)
	r.mu.Unlock()
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
	b.ReportMetric(at(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// Latency is omnibus's side of a latency benchmark: a consumer of topic
// on c, subscribed with opts, whose handler records each body, runs
// while MeasureLatency sends with send; it stops when the measure ends.
func Latency(b *testing.B, c *omnibus.Client, topic string, send func(body []byte) error, opts ...omnibus.SubscribeOption) {
	b.Helper()
	r := NewRecorder()
	k, err := c.Subscribe(context.Background(), topic, func(_ context.Context, m *omnibus.Message) error {
		r.Received(m.Body)
		return nil
	}, opts...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- k.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			b.Errorf("Run: %v", err)
		}
	}()
	MeasureLatency(b, r, send)
}

// Publisher opens a Publisher on c, closed when b ends.
func Publisher(b *testing.B, c *omnibus.Client) *omnibus.Publisher {
	b.Helper()
	p, err := c.Publisher()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// CPUTime is the processor time (user and system) the process has used.
// Where client and servers share a machine's cores, what a side costs
// per message varies less than its rate.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

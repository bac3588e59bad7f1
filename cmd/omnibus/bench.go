package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/spf13/cobra"
)

// headerSent carries the publish time (Unix nanoseconds) of a bench
// message, for end-to-end latency.
const headerSent = "omnibus-bench-sent"

type benchOptions struct {
	url     string
	topic   string
	count   int
	size    int
	batch   int
	lanes   int
	json    bool
	force   bool
	timeout time.Duration
}

func (a *app) benchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench [--topic T] [--count N] [--size BYTES] [--json]",
		Short: "Measure publish and consume throughput and end-to-end latency",
		Long: `bench publishes --count messages of --size bytes while a consumer group
reads them, through omnibus, and reports publish and consume rates and the
p50 / p99 end-to-end latency (publish call to handler; the publish time
travels in a header). It then publishes --count more messages through a
Publisher (asynchronous, batches coalesced) and reports that rate too.
Where the transport has a raw-client baseline, bench runs the same work
through the transport's own client in the same run and prints the ratio:
the same headers, the same publish batches each waiting for its acks, the
same consumer windows.

The topic is fresh for each run unless --topic names one; bench refuses a
--topic that exists (its consumer groups would receive bench's messages)
unless --force is given. On the default URL bench runs on a temporary
store, removed at the end. On other URLs it removes at the end what it
made there, also when it fails or is interrupted: its consumer group, its
fresh topic (a --topic of yours stays, with bench's messages) and what the
raw baseline made. What the transport cannot remove, bench names.`,
		Example: `  omnibus bench
  omnibus bench --count 50000 --size 1024 --json
  omnibus bench --url nats://localhost:4222 --topic bench`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.bench(cmd.Context(), o) },
	}
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.StringVarP(&o.topic, "topic", "t", "", "topic (default: a fresh one)")
	f.IntVar(&o.count, "count", 10000, "messages")
	f.IntVar(&o.size, "size", 100, "body size in bytes")
	f.IntVar(&o.batch, "batch", 100, "messages per publish call")
	f.IntVar(&o.lanes, "lanes", 4, "lanes of a fresh topic")
	f.BoolVar(&o.json, "json", false, "print one JSON object")
	f.BoolVar(&o.force, "force", false, "publish to --topic even if it exists")
	f.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up when consuming takes longer than this")
	return cmd
}

// benchResult is the --json shape.
type benchResult struct {
	Transport       string  `json:"transport"`
	URL             string  `json:"url"`
	Topic           string  `json:"topic"`
	Group           string  `json:"group"`
	Size            int     `json:"size"`
	Count           int     `json:"count"`
	PublishMsgsPerS float64 `json:"publish_msgs_per_s"`
	ConsumeMsgsPerS float64 `json:"consume_msgs_per_s"`
	PublishMiBPerS  float64 `json:"publish_mib_per_s"`
	// AsyncPublishMsgsPerS is the rate of the same messages published
	// through a Publisher (asynchronous, batched), after the consumer
	// stopped.
	AsyncPublishMsgsPerS float64 `json:"async_publish_msgs_per_s"`
	P50Ms                float64 `json:"p50_ms"`
	P99Ms                float64 `json:"p99_ms"`
	// The raw-client baseline, absent when the transport has none.
	Baseline           string   `json:"baseline,omitempty"`
	RawPublishMsgsPerS *float64 `json:"raw_publish_msgs_per_s,omitempty"`
	RawConsumeMsgsPerS *float64 `json:"raw_consume_msgs_per_s,omitempty"`
	PublishRatio       *float64 `json:"publish_ratio,omitempty"`
	ConsumeRatio       *float64 `json:"consume_ratio,omitempty"`
	NoBaseline         string   `json:"no_baseline,omitempty"`
	// Left names what bench made on the transport and could not remove,
	// empty when nothing.
	Left string `json:"left,omitempty"`
}

func (a *app) bench(ctx context.Context, o benchOptions) error {
	if o.count < 1 || o.size < 0 || o.batch < 1 || o.lanes < 1 || o.timeout <= 0 {
		return usagef("bench: --count, --batch and --lanes must be at least 1, --size at least 0, --timeout positive")
	}
	c, scratch, done, err := a.openScratch(ctx, o.url)
	if err != nil {
		return err
	}
	defer done()
	run := shortID()
	topic, group := o.topic, "omnibus-bench-"+run
	if topic == "" {
		topic = "omnibus-bench-" + run
	} else if tx, ok := c.Driver().(topicExister); ok && !o.force {
		exists, err := tx.TopicExists(ctx, topic)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if exists {
			return usagef("bench: topic %q exists: its consumer groups would receive bench's %d messages; omit --topic for a fresh one, or add --force", topic, 2*o.count)
		}
	}
	res := benchResult{Transport: scheme(a.rawURL), URL: a.urlName(), Topic: topic, Group: group, Size: o.size, Count: o.count}
	var left leftovers
	err = a.benchRun(ctx, c, topic, group, o, &res, &left)
	if !scratch {
		var topics []string
		if o.topic == "" {
			topics = []string{topic} // a --topic is the user's
		}
		removeMade(ctx, c, []groupOn{{topic, group}}, topics, &left)
	}
	res.Left = omnibus.Redact(strings.Join(left, "; "), a.rawURL)
	if err != nil {
		if res.Left != "" {
			fmt.Fprintf(a.stderr, "omnibus: note: bench left on the transport: %s\n", oneLine(res.Left))
		}
		return err
	}
	if o.json {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%s\n", b)
		return nil
	}
	printBench(a, res)
	return nil
}

// benchRun runs the work through omnibus on topic with group, then
// through the transport's raw client where it has a baseline, into res;
// what the baseline cannot remove goes in left.
func (a *app) benchRun(ctx context.Context, c *omnibus.Client, topic, group string, o benchOptions, res *benchResult, left *leftovers) error {
	if err := benchOmnibus(ctx, c, topic, group, o, res); err != nil {
		return err
	}
	b, ok := baselines[res.Transport]
	if !ok {
		res.NoBaseline = noBaseline[res.Transport]
		if res.NoBaseline == "" {
			res.NoBaseline = "no raw-client baseline registered for " + res.Transport
		}
		return nil
	}
	res.Baseline = b.client
	pub, con, err := b.run(ctx, c, a.rawURL, topic+"-raw", o, left)
	if ctx.Err() != nil {
		return errInterrupted
	}
	if err != nil {
		// The omnibus numbers stand; say why there is no comparison.
		res.Baseline = ""
		res.NoBaseline = oneLine(omnibus.Redact(fmt.Sprintf("the raw %s baseline failed: %v", b.client, err), a.rawURL))
		return nil
	}
	res.RawPublishMsgsPerS, res.RawConsumeMsgsPerS = &pub, &con
	if pub > 0 {
		r := res.PublishMsgsPerS / pub
		res.PublishRatio = &r
	}
	if con > 0 {
		r := res.ConsumeMsgsPerS / con
		res.ConsumeRatio = &r
	}
	return nil
}

func printBench(a *app, r benchResult) {
	fmt.Fprintf(a.stdout, "bench %s  topic %s  %d messages of %d bytes\n", r.URL, r.Topic, r.Count, r.Size)
	fmt.Fprintf(a.stdout, "  omnibus  publish %10.0f msgs/s (%.1f MiB/s)  consume %10.0f msgs/s  latency p50 %.2f ms  p99 %.2f ms\n",
		r.PublishMsgsPerS, r.PublishMiBPerS, r.ConsumeMsgsPerS, r.P50Ms, r.P99Ms)
	fmt.Fprintf(a.stdout, "  omnibus  publish %10.0f msgs/s asynchronously (a Publisher, batches coalesced)\n", r.AsyncPublishMsgsPerS)
	if r.Left != "" {
		defer fmt.Fprintf(a.stdout, "  left on the transport: %s\n", r.Left)
	}
	if r.RawPublishMsgsPerS == nil {
		fmt.Fprintf(a.stdout, "  raw      no baseline: %s\n", r.NoBaseline)
		return
	}
	fmt.Fprintf(a.stdout, "  raw      publish %10.0f msgs/s               consume %10.0f msgs/s  (%s)\n",
		*r.RawPublishMsgsPerS, *r.RawConsumeMsgsPerS, r.Baseline)
	ratio := func(p *float64) string {
		if p == nil {
			return "n/a"
		}
		return fmt.Sprintf("%.0f%%", 100**p)
	}
	fmt.Fprintf(a.stdout, "  omnibus / raw: publish %s, consume %s\n", ratio(r.PublishRatio), ratio(r.ConsumeRatio))
}

// benchOmnibus runs the work through omnibus: a consumer group reads while
// a producer publishes.
func benchOmnibus(ctx context.Context, c *omnibus.Client, topic, group string, o benchOptions, res *benchResult) error {
	if err := c.CreateTopic(ctx, topic, o.lanes); err != nil {
		return err
	}
	var (
		lat      latencies
		received atomic.Int64
		lastRecv atomic.Int64 // Unix nanoseconds
		done     = make(chan struct{})
	)
	handler := func(_ context.Context, m *omnibus.Message) error {
		now := time.Now()
		lat.add(now, m.Headers[headerSent])
		lastRecv.Store(now.UnixNano())
		if received.Add(1) == int64(o.count) {
			close(done)
		}
		return nil
	}
	start := omnibus.StartLatest
	if c.Capabilities().Replay {
		start = omnibus.StartEarliest // a fresh topic: nothing missed while the group forms
	}
	k, err := c.Subscribe(ctx, topic, handler, omnibus.StartFrom(start), omnibus.Group(group))
	if err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- k.Run(context.WithoutCancel(ctx)) }() // ended by Shutdown below
	stopConsumer := func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		serr := k.Shutdown(sctx)
		if rerr := <-runErr; rerr != nil {
			return rerr
		}
		if serr != nil && !errors.Is(serr, omnibus.ErrClosed) {
			return serr
		}
		return nil
	}

	body := generatedBody(0, o.size)
	t0 := time.Now()
	for i := 0; i < o.count; i += o.batch {
		n := min(o.batch, o.count-i)
		batch := make([]*omnibus.Message, n)
		sent := strconv.FormatInt(time.Now().UnixNano(), 10)
		for j := range batch {
			batch[j] = &omnibus.Message{Key: "k" + strconv.Itoa((i+j)%64), Headers: map[string]string{headerSent: sent}, Body: body}
		}
		if err := c.Publish(ctx, topic, batch...); err != nil {
			serr := stopConsumer()
			if ctx.Err() != nil {
				return errInterrupted
			}
			return errors.Join(fmt.Errorf("bench: %w", err), serr)
		}
	}
	pubDur := time.Since(t0)

	timer := time.NewTimer(o.timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		_ = stopConsumer()
		return errInterrupted
	case <-timer.C:
		_ = stopConsumer()
		return fmt.Errorf("bench: consumed %d of %d messages in %v", received.Load(), o.count, o.timeout)
	case err := <-runErr:
		runErr <- err // for stopConsumer
		_ = stopConsumer()
		return err
	}
	conDur := time.Unix(0, lastRecv.Load()).Sub(t0)
	if err := stopConsumer(); err != nil {
		return err
	}
	asyncDur, err := benchPublisher(ctx, c, topic, o)
	if err != nil {
		return err
	}
	res.AsyncPublishMsgsPerS = rate(o.count, asyncDur)
	res.PublishMsgsPerS = rate(o.count, pubDur)
	res.PublishMiBPerS = rate(o.count*o.size, pubDur) / (1 << 20)
	res.ConsumeMsgsPerS = rate(o.count, conDur)
	res.P50Ms, res.P99Ms = lat.percentiles()
	return nil
}

// benchPublisher publishes o.count messages to topic through a Publisher
// and returns how long it took until the last was confirmed.
func benchPublisher(ctx context.Context, c *omnibus.Client, topic string, o benchOptions) (time.Duration, error) {
	p, err := c.Publisher()
	if err != nil {
		return 0, err
	}
	defer p.Close(context.WithoutCancel(ctx))
	body := generatedBody(0, o.size)
	results := make([]*omnibus.PublishResult, o.count)
	t0 := time.Now()
	for i := range results {
		m := &omnibus.Message{Key: "k" + strconv.Itoa(i%64), Headers: map[string]string{headerSent: strconv.FormatInt(time.Now().UnixNano(), 10)}, Body: body}
		if results[i], err = p.Publish(ctx, topic, m); err != nil {
			if ctx.Err() != nil {
				return 0, errInterrupted
			}
			return 0, fmt.Errorf("bench: async publish: %w", err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		return 0, errInterrupted
	}
	d := time.Since(t0)
	for _, r := range results {
		if err := r.Err(); err != nil {
			return 0, fmt.Errorf("bench: async publish: %w", err)
		}
	}
	return d, nil
}

// latencies collects end-to-end latencies: from the send time a message
// carries in headerSent to its handling.
type latencies struct {
	mu sync.Mutex
	ds []time.Duration
}

func (l *latencies) add(now time.Time, sent string) {
	ns, err := strconv.ParseInt(sent, 10, 64)
	if err != nil {
		return
	}
	l.mu.Lock()
	l.ds = append(l.ds, now.Sub(time.Unix(0, ns)))
	l.mu.Unlock()
}

// percentiles returns the p50 and p99 latencies in milliseconds.
func (l *latencies) percentiles() (p50, p99 float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.ds)
	return ms(percentile(l.ds, 0.50)), ms(percentile(l.ds, 0.99))
}

// percentile returns the q-quantile of sorted (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// shortID is a short random name part, for fresh topics and groups.
func shortID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

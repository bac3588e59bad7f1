package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/promomnibus"
	"github.com/spf13/cobra"
)

type tailOptions struct {
	url         string
	topic       string
	group       string
	from        string
	max         int
	json        bool
	metricsAddr string
}

func (a *app) tailCmd() *cobra.Command {
	var o tailOptions
	cmd := &cobra.Command{
		Use:   "tail --topic T [--group G] [--from earliest|latest] [--max N] [--json] [--metrics-addr ADDR]",
		Short: "Print messages as they arrive",
		Long: `tail prints the messages of a topic as they arrive and acknowledges each
after it is written. Without --group it reads as a throwaway consumer
group, so it takes nothing away from the topic's real consumers; with
--group it is one more member of that group.

It stops after --max messages or on Ctrl-C, cleanly: it acknowledges
what it wrote, and hands what it received but did not write back to the
transport unacknowledged, for the group to read again at once (on NATS
without partitions, some only after the group's ack_wait). On a topic
that does not exist yet it says so, and waits for the topic's first
message.

--json prints one object per line with the fields id, key, type, source,
time, headers, body, topic, lane and position; a body that is not valid
UTF-8 is base64 and has "body_base64": true.

--metrics-addr serves the consumer's metrics for Prometheus at
http://ADDR/metrics while tail runs (the families of package promomnibus:
messages received and handled, in flight, members and the group's lag
per lane), and says where on standard error.`,
		Example: `  omnibus tail --topic orders
  omnibus tail --topic orders.dlq --from earliest --json | jq .headers
  omnibus tail --url kafka://localhost:9092 --topic orders --group audit --max 100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.tail(cmd.Context(), o) },
	}
	f := cmd.Flags()
	addURLFlag(cmd, &o.url)
	f.StringVarP(&o.topic, "topic", "t", "", "topic to read (required)")
	f.StringVarP(&o.group, "group", "g", "", "consumer group (default: a throwaway group)")
	f.StringVar(&o.from, "from", "latest", "where a new group starts: earliest or latest")
	f.IntVar(&o.max, "max", 0, "stop after this many messages (0: no limit)")
	f.BoolVar(&o.json, "json", false, "print one JSON object per message")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (host:port; port 0 picks one)")
	return cmd
}

// tailMessage is the --json shape of a message.
type tailMessage struct {
	ID         string            `json:"id"`
	Key        string            `json:"key"`
	Type       string            `json:"type"`
	Source     string            `json:"source"`
	Time       time.Time         `json:"time"`
	Headers    map[string]string `json:"headers"`
	Body       string            `json:"body"`
	BodyBase64 bool              `json:"body_base64,omitempty"`
	Topic      string            `json:"topic"`
	Lane       string            `json:"lane"`
	Position   string            `json:"position"`
}

func newTailMessage(m *omnibus.Message) tailMessage {
	t := tailMessage{ID: m.ID, Key: m.Key, Type: m.Type, Source: m.Source, Time: m.Time,
		Headers: m.Headers, Topic: m.Topic, Lane: m.Lane, Position: m.Position}
	if t.Headers == nil {
		t.Headers = map[string]string{}
	}
	t.Body, t.BodyBase64 = bodyText(m.Body)
	return t
}

// bodyText returns the body as text, or as base64 when it is not UTF-8.
func bodyText(b []byte) (string, bool) {
	if utf8.Valid(b) {
		return string(b), false
	}
	return base64.StdEncoding.EncodeToString(b), true
}

// formatText is the human shape of a message: one line.
func formatText(m *omnibus.Message) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s@%s", m.Lane, m.Position)
	if m.Key != "" {
		fmt.Fprintf(&sb, " key=%s", m.Key)
	}
	if m.Type != "" {
		fmt.Fprintf(&sb, " type=%s", m.Type)
	}
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		fmt.Fprintf(&sb, " %s=%s", k, m.Headers[k])
	}
	body, b64 := bodyText(m.Body)
	if b64 {
		body = "base64:" + body
	}
	sb.WriteString(" | ")
	sb.WriteString(body)
	sb.WriteByte('\n')
	return sb.String()
}

var errTailStopped = errors.New("tail stopped before writing the message")

func (a *app) tail(ctx context.Context, o tailOptions) error {
	if o.topic == "" {
		return usagef("tail: --topic is required")
	}
	if o.max < 0 {
		return usagef("tail: --max %d: want 0 or more", o.max)
	}
	var start omnibus.StartAt
	switch o.from {
	case "latest":
		start = omnibus.StartLatest
	case "earliest":
		start = omnibus.StartEarliest
	default:
		return usagef("tail: --from %q: want earliest or latest", o.from)
	}
	c, err := a.open(ctx, o.url)
	if err != nil {
		return err
	}
	defer a.closeClient(c)
	a.noteProcessLocal()

	if tx, ok := c.Driver().(topicExister); ok {
		if exists, err := tx.TopicExists(ctx, o.topic); err == nil && !exists {
			fmt.Fprintf(a.stderr, "omnibus: note: topic %q does not exist yet (misspelt?): tail creates it and waits for its first message\n", o.topic)
		}
	}

	// stop is closed once when tail must end: --max reached, a write
	// failed, or Ctrl-C. A handler that gets a message it may not write
	// (past --max, or after a failed write) holds it until the consumer
	// closes, which hands it back to the transport unacknowledged.
	var (
		mu        sync.Mutex
		written   int
		writeErr  error
		stop      = make(chan struct{})
		stopOnce  sync.Once
		processed atomic.Int64 // written messages settled
		acked     atomic.Int64 // messages acknowledged (brokers)
	)
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	handler := func(hctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		if (o.max > 0 && written >= o.max) || writeErr != nil {
			mu.Unlock()
			<-hctx.Done() // cancelled when the consumer closes
			return errTailStopped
		}
		var out []byte
		if o.json {
			out, _ = json.Marshal(newTailMessage(m))
			out = append(out, '\n')
		} else {
			out = []byte(formatText(m))
		}
		if _, err := a.stdout.Write(out); err != nil {
			writeErr = fmt.Errorf("tail: write: %w", err)
			mu.Unlock()
			halt()
			<-hctx.Done()
			return errTailStopped
		}
		written++
		if o.max > 0 && written == o.max {
			halt()
		}
		mu.Unlock()
		return nil
	}
	observe := func(e omnibus.Event) {
		switch {
		case e.Kind == omnibus.EventProcessed:
			processed.Add(1)
		case e.Kind == omnibus.EventAcked:
			acked.Add(int64(e.Count))
		}
	}

	ordering := omnibus.OrderNone
	if c.Capabilities().Ordered {
		ordering = omnibus.OrderLane // print each lane in order
	}
	window := 64
	if ordering == omnibus.OrderNone {
		window = 1 // print what the transport delivers in its order
	}
	if o.max > 0 {
		window = min(window, o.max) // fetch little beyond --max
	}
	opts := []omnibus.SubscribeOption{omnibus.StartFrom(start), omnibus.Order(ordering),
		omnibus.MaxInFlight(window), omnibus.DrainTimeout(5 * time.Second),
		// tail only reads: it must never dead-letter what it did not write.
		omnibus.MaxAttempts(math.MaxInt32), omnibus.Observe(observe)}
	if o.group != "" {
		opts = append(opts, omnibus.Group(o.group))
	}
	if o.metricsAddr != "" {
		col := promomnibus.New()
		s, err := serveMetrics(o.metricsAddr, col)
		if err != nil {
			return fmt.Errorf("tail: %w", err)
		}
		defer s.close()
		fmt.Fprintf(a.stderr, "omnibus: note: serving metrics at %s\n", s.url)
		opts = append(opts, omnibus.Hooks(col))
	}
	k, err := c.Subscribe(ctx, o.topic, handler, opts...)
	if err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- k.Run(context.WithoutCancel(ctx)) }() // ended by Close below
	select {
	case <-ctx.Done():
	case <-stop:
	case err := <-runErr:
		return err
	}
	halt()
	// Settle what was written, then hand back the rest: wait until every
	// written message is settled (on brokers, acknowledged), then stop
	// the consumer at once. Its last flush commits a log's settled
	// positions; the handlers holding unwritten messages return, and
	// those go back to the transport unacknowledged.
	mu.Lock()
	n := int64(written)
	mu.Unlock()
	settledCount := &processed
	if c.Capabilities().Lag != driver.LagRecords {
		settledCount = &acked
	}
	for deadline := time.Now().Add(10 * time.Second); settledCount.Load() < n && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the engine records a settlement just after announcing it
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cancel()
	serr := k.Shutdown(sctx)
	if err := <-runErr; err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if writeErr != nil {
		return writeErr
	}
	var ue *omnibus.UnsettledError
	if serr != nil && !errors.As(serr, &ue) {
		return serr
	}
	return nil
}

package sqlbus_test

// Benchmarks: the outbox's commit-to-publish latency on PostgreSQL with
// LISTEN/NOTIFY and with polling, and the relay's throughput beside a
// plain Publish of the same messages through the same client:
//
//	go test -run '^$' -bench OutboxLatency -benchtime 40x ./sqlbus/
//	go test -run '^$' -bench RelayThroughput -benchtime 20000x ./sqlbus/

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/sqlbus"
)

// published records when each message ID's publish returned.
type published struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (p *published) OnPublish(ctx context.Context, topic string, msgs []*omnibus.Message) (context.Context, func(error)) {
	return ctx, func(err error) {
		if err != nil {
			return
		}
		now := time.Now()
		p.mu.Lock()
		for _, m := range msgs {
			p.at[m.ID] = now
		}
		p.mu.Unlock()
	}
}

func (p *published) when(id string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.at[id]
	return t, ok
}

// BenchmarkOutboxLatency: the time from a commit's return to the return
// of the relay's publish of its message, on PostgreSQL, one message per
// transaction. "busy" commits every 20 ms (the relay stays awake and
// polls), "idle" every 1.2 s (the relay sleeps: NOTIFY wakes it, or its
// poll does).
func BenchmarkOutboxLatency(b *testing.B) {
	db := databases[0]
	for _, gap := range []time.Duration{20 * time.Millisecond, 1200 * time.Millisecond} {
		for _, mode := range []struct {
			name string
			opts []sqlbus.RelayOption
		}{
			{"notify", nil},
			{"poll-100ms", []sqlbus.RelayOption{sqlbus.Notify(false), sqlbus.Poll(100 * time.Millisecond)}},
			{"poll-10ms", []sqlbus.RelayOption{sqlbus.Notify(false), sqlbus.Poll(10 * time.Millisecond)}},
		} {
			load := "busy"
			if gap > time.Second {
				load = "idle"
			}
			b.Run(load+"/"+mode.name, func(b *testing.B) {
				st := newStore(b, openDB(b, db), db.dialect)
				pub := &published{at: map[string]time.Time{}}
				c, err := omnibus.Open(context.Background(), "mem://"+st.Prefix(), omnibus.WithHooks(pub))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = c.Close() })
				runRelay(b, st, c, mode.opts...)
				time.Sleep(300 * time.Millisecond) // listening
				ctx := context.Background()
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := range b.N {
					id := fmt.Sprint("lat-", i)
					tx, err := st.DB().BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if err := sqlbus.Publish(ctx, st, tx, "bench", &omnibus.Message{ID: id, Key: id, Body: []byte("x")}); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
					committed := time.Now()
					deadline := committed.Add(10 * time.Second)
					for {
						if at, ok := pub.when(id); ok {
							lat = append(lat, at.Sub(committed))
							break
						}
						if time.Now().After(deadline) {
							b.Fatalf("%s not published after 10s", id)
						}
						time.Sleep(200 * time.Microsecond)
					}
					time.Sleep(gap)
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkRelayThroughput: b.N messages of 100 bytes committed to the
// outbox (in transactions of 100), then published by one relay, beside
// a plain Publish of as many messages in calls of 100 through the same
// client, alternating, on Kafka (kfake, in the process). msgs/s of each
// and their ratio.
func BenchmarkRelayThroughput(b *testing.B) {
	for _, db := range databases {
		b.Run(db.name, func(b *testing.B) {
			st := newStore(b, openDB(b, db), db.dialect)
			c := openBus(b, kafkaURL(b))
			ctx := context.Background()
			if err := c.CreateTopic(ctx, "bench", 4); err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 100)
			msgs := func(n int, prefix string) []*omnibus.Message {
				ms := make([]*omnibus.Message, n)
				for i := range ms {
					ms[i] = &omnibus.Message{ID: fmt.Sprint(prefix, i), Key: fmt.Sprint("k", i%64), Body: body}
				}
				return ms
			}
			var relayTime, plainTime time.Duration
			const rounds = 2
			n := max(b.N/rounds, 100)
			b.ResetTimer()
			for r := range rounds {
				// Plain publishing.
				ms := msgs(n, fmt.Sprint("p", r, "-"))
				start := time.Now()
				for i := 0; i < n; i += 100 {
					if err := c.Publish(ctx, "bench", ms[i:min(n, i+100)]...); err != nil {
						b.Fatal(err)
					}
				}
				plainTime += time.Since(start)
				// Through the outbox: committed first, then relayed.
				ms = msgs(n, fmt.Sprint("r", r, "-"))
				for i := 0; i < n; i += 100 {
					tx, err := st.DB().BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					if err := sqlbus.Publish(ctx, st, tx, "bench", ms[i:min(n, i+100)]...); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
				relay, err := sqlbus.NewRelay(st, c)
				if err != nil {
					b.Fatal(err)
				}
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				start = time.Now()
				go func() { defer close(done); _ = relay.Run(rctx) }()
				for relay.Stats().Published < int64(n) {
					time.Sleep(time.Millisecond)
				}
				relayTime += time.Since(start)
				if s := relay.Stats(); s.Failures > 0 {
					b.Logf("relay: %+v", s)
				}
				cancel()
				<-done
			}
			b.StopTimer()
			total := float64(n * rounds)
			relayRate, plainRate := total/relayTime.Seconds(), total/plainTime.Seconds()
			b.ReportMetric(relayRate, "relay-msgs/s")
			b.ReportMetric(plainRate, "publish-msgs/s")
			b.ReportMetric(relayRate/plainRate, "relay/publish")
			b.ReportMetric(0, "ns/op")
		})
	}
}

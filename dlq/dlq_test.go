package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/dlq"
	"github.com/omnibus-go/omnibus/dlq/dlqtest"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
	"github.com/omnibus-go/omnibus/internal/testenv"
	_ "github.com/omnibus-go/omnibus/kinesisbus"
	_ "github.com/omnibus-go/omnibus/redisbus"
	"github.com/redis/go-redis/v9"
)

// transports are observetest's, JetStream in partitioned mode (the
// omnibus command's default), Kinesis (kinesalite and dynalite) and Redis
// Streams.
var transports = append(slices.Clone(observetest.Transports),
	observetest.Transport{Name: "nats-partitioned", URL: func(t testing.TB, ns string) string {
		return "nats://embedded?partitions=4&dir=" + t.TempDir()
	}},
	observetest.Transport{Name: "kinesis", URL: func(t testing.TB, ns string) string {
		testenv.Require(t, "kinesalite", "127.0.0.1:4567", "scripts/test.sh")
		testenv.Require(t, "dynalite", "127.0.0.1:4568", "scripts/test.sh")
		t.Cleanup(func() { deleteKinesis(t, ns) })
		return "kinesis://AKIDTEST:secretTEST@us-east-1?endpoint=http://127.0.0.1:4567&dynamodb_endpoint=http://127.0.0.1:4568" +
			"&failover_time=1s&shard_sync_interval=1s&poll_interval=50ms"
	}},
	observetest.Transport{Name: "redis", URL: func(t testing.TB, ns string) string {
		testenv.Require(t, "Redis", "127.0.0.1:6379", "redis-server --daemonize yes")
		t.Cleanup(func() {
			rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
			defer rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			it := rdb.Scan(ctx, 0, "*"+ns+"*", 1000).Iterator()
			for it.Next(ctx) {
				_ = rdb.Del(ctx, it.Val()).Err()
			}
		})
		return "redis://127.0.0.1:6379"
	}},
)

// fixture is a service of topic orders (group billing) on a transport,
// and the dead letters it made.
type fixture struct {
	ctx         context.Context
	c           *omnibus.Client
	ns          string
	topic, dead string
	svc         *dlqtest.Service
	ids         []string
	q           *dlq.Queue
}

// setup makes n dead letters (bodies from body, see dlqtest.Publish) on tr.
func setup(t *testing.T, tr observetest.Transport, n int, body func(int) []byte) *fixture {
	t.Helper()
	f := &fixture{ctx: ctxT(t, 3*time.Minute), ns: observetest.Namespace()}
	republished := &dlqtest.Republished{}
	f.c = observetest.Open(t, tr.URL(t, f.ns), omnibus.WithHooks(republished))
	f.topic, f.dead = f.ns+".orders", f.ns+".orders.dlq"
	if err := f.c.CreateTopic(f.ctx, f.topic, 4); err != nil {
		t.Fatal(err)
	}
	f.svc = dlqtest.Start(t, f.ctx, f.c, f.topic, "billing")
	f.svc.Republished = republished
	f.ids = f.svc.Publish(t, f.ctx, f.c, f.topic, n, body)
	var err error
	if f.q, err = dlq.New(f.c, f.dead); err != nil {
		t.Fatal(err)
	}
	return f
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestListAndReplay, on every transport: 300 dead letters (one of 512
// KiB) are listed twice with their headers parsed and nothing consumed;
// a replay to a topic that does not exist fails before anything moves;
// replaying a selection and then the rest hands each message back to the
// service exactly once, with the replay recorded and the large body
// whole; afterwards the dead-letter topic is as documented.
func TestListAndReplay(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.Name, func(t *testing.T) {
			large := bytes.Repeat([]byte("0123456789abcdef"), 512<<10/16)
			const n = 300
			f := setup(t, tr, n, func(i int) []byte {
				if i == 7 {
					return large
				}
				return fmt.Appendf(nil, `{"order":%d}`, i)
			})
			ctx, c, ns, topic, dead, svc, ids, q := f.ctx, f.c, f.ns, f.topic, f.dead, f.svc, f.ids, f.q
			for round := range 2 {
				l, err := q.List(ctx, dlq.ListOptions{Limit: 1000})
				if err != nil {
					t.Fatalf("list %d: %v", round, err)
				}
				if got := len(l.DeadLetters); got != n || l.Read < n {
					checkParsed(t, l.DeadLetters, ids, topic, large)
					t.Fatalf("list %d: %d dead letters (%d read), want %d", round, got, l.Read, n)
				}
				if l.Total != -1 && l.Total != n {
					t.Errorf("list %d: total %d, want %d (or -1)", round, l.Total, n)
				}
				checkParsed(t, l.DeadLetters, ids, topic, large)
			}

			// membus cannot tell a missing topic: publishing makes it,
			// and a log keeps what is published for any group.
			if tr.Name != "membus" {
				p, err := q.Replay(ctx, dlq.ReplayOptions{To: ns + ".nowhere"})
				// Read: where the transport cannot tell beforehand
				// (Kinesis), the publish fails instead.
				if !errors.Is(err, omnibus.ErrNotFound) || p.Replayed != 0 {
					t.Errorf("replay to a missing topic: %+v, %v; want ErrNotFound, nothing replayed", p, err)
				}
			}
			if _, err := q.Replay(ctx, dlq.ReplayOptions{To: dead}); !errors.Is(err, omnibus.ErrInvalid) {
				t.Errorf("replay to the dead-letter topic itself: %v, want ErrInvalid", err)
			}

			// A selection first: key k3's messages.
			var sel []string
			for i, id := range ids {
				if i%37 == 3 {
					sel = append(sel, id)
				}
			}
			p, err := q.Replay(ctx, dlq.ReplayOptions{Filter: dlq.Filter{Key: "k3"}})
			if err != nil {
				t.Fatalf("replay k3: %v", err)
			}
			if p.Replayed != len(sel) || p.Selected != len(sel) || p.Read != n {
				t.Errorf("replay k3: %+v, want %d replayed of %d read", p, len(sel), n)
			}
			// Only ordered lanes move what they pass.
			if ordered := c.Capabilities().Ordered; (p.Moved > 0) != ordered {
				t.Errorf("replay k3 moved %d dead letters, want some on a log that commits positions, none elsewhere", p.Moved)
			}
			svc.WaitHandled(t, sel)

			l, err := q.List(ctx, dlq.ListOptions{Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if len(l.DeadLetters) != n-len(sel) {
				t.Errorf("after the selection: %d listed, want %d", len(l.DeadLetters), n-len(sel))
			}
			checkParsed(t, l.DeadLetters, ids, topic, large)
			for _, d := range l.DeadLetters {
				if slices.Contains(sel, d.ID) {
					t.Errorf("replayed %s is still listed", d.ID)
				}
			}

			// Then the rest.
			var progress []dlq.Progress
			p, err = q.Replay(ctx, dlq.ReplayOptions{Batch: 50, Bounds: dlq.Bounds{
				Progress: func(p dlq.Progress) { progress = append(progress, p) }}})
			if err != nil {
				t.Fatalf("replay the rest: %v", err)
			}
			if p.Replayed != n-len(sel) || p.Moved != 0 {
				t.Errorf("replay the rest: %+v, want %d replayed, none moved", p, n-len(sel))
			}
			if len(progress) == 0 || progress[len(progress)-1] != p {
				t.Errorf("progress reports %v, the last not the result %+v", progress, p)
			}
			svc.WaitHandled(t, without(ids, sel))

			m := svc.Message(ids[7])
			if !bytes.Equal(m.Body, large) {
				t.Errorf("the large body came back with %d bytes, want %d", len(m.Body), len(large))
			}
			if m.ID != ids[7]+"-r1" || m.Headers[dlq.HeaderReplayedFrom] != dead || m.Headers[dlq.HeaderReplays] != "1" || m.Headers["tenant"] != "acme" ||
				m.Headers[omnibus.HeaderDeadReason] != "" || m.Type != "test.order" {
				t.Errorf("replayed message: ID %s type %q headers %v; want the replay recorded, the dead-letter headers gone", m.ID, m.Type, m.Headers)
			}
			if at, err := time.Parse(time.RFC3339Nano, m.Headers[dlq.HeaderReplayedAt]); err != nil || time.Since(at) > time.Minute {
				t.Errorf("replayed-at %q: %v", m.Headers[dlq.HeaderReplayedAt], err)
			}

			l, err = q.List(ctx, dlq.ListOptions{Limit: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if len(l.DeadLetters) != 0 || l.Total > 0 {
				t.Errorf("after replaying all: %d listed, total %d; want none", len(l.DeadLetters), l.Total)
			}
			if n, known, err := q.Count(ctx); err != nil || (known && n != 0) {
				t.Errorf("count after replaying all: %d (known %v), %v; want 0", n, known, err)
			}
		})
	}
}

func without(ids, drop []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(drop, id) {
			out = append(out, id)
		}
	}
	return out
}

// checkParsed checks that each dead letter of the service parsed as the
// engine wrote it.
func checkParsed(t *testing.T, dls []*dlq.DeadLetter, ids []string, topic string, large []byte) {
	t.Helper()
	seen := map[string]bool{}
	for _, d := range dls {
		if seen[d.ID] {
			t.Errorf("listed %s twice", d.ID)
		}
		seen[d.ID] = true
		i := slices.Index(ids, d.ID)
		if i < 0 {
			t.Errorf("listed %s, which was not published", d.ID)
			continue
		}
		if d.OriginTopic != topic || d.OriginGroup != "billing" || d.Attempts != 1 || d.Reason != "poison: k"+strconv.Itoa(i%37) ||
			d.OriginLane == "" || d.OriginPosition == "" || d.FirstFailure.IsZero() || d.LastFailure.Before(d.FirstFailure) ||
			time.Since(d.LastFailure) > 5*time.Minute || d.Lane == "" || d.Headers["tenant"] != "acme" {
			t.Errorf("dead letter %d parsed as %+v", i, *d)
		}
		if i == 7 && !bytes.Equal(d.Body, large) {
			t.Errorf("the large body listed with %d bytes, want %d", len(d.Body), len(large))
		}
	}
}

// TestStopAndDelete, on every transport: a replay of 1,000 dead letters
// stopped part way returns what it did, and exactly that was handed
// back; a delete removes its selection without publishing it; a second
// replay sends the rest, each message exactly once over both.
func TestStopAndDelete(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.Name, func(t *testing.T) {
			const n = 1000
			f := setup(t, tr, n, nil)
			ctx, svc, ids, q := f.ctx, f.svc, f.ids, f.q

			var k5 []string
			for i, id := range ids {
				if i%37 == 5 {
					k5 = append(k5, id)
				}
			}
			p, err := q.Delete(ctx, dlq.DeleteOptions{Filter: dlq.Filter{Key: "k5"}})
			if err != nil || p.Deleted != len(k5) || p.Replayed != 0 {
				t.Fatalf("delete k5: %+v, %v; want %d deleted", p, err, len(k5))
			}
			rest := without(ids, k5)

			stopCtx, stop := context.WithCancel(ctx)
			p, err = q.Replay(stopCtx, dlq.ReplayOptions{Batch: 20, Bounds: dlq.Bounds{Progress: func(p dlq.Progress) {
				if p.Replayed >= 300 {
					stop()
				}
			}}})
			stop()
			if !errors.Is(err, context.Canceled) || p.Replayed < 300 || p.Replayed >= len(rest) {
				t.Fatalf("stopped replay: %+v, %v; want context.Canceled after 300 or more", p, err)
			}
			dlqtest.Eventually(t, 30*time.Second, func() error {
				if h := len(svc.Handled()); h != p.Replayed {
					return fmt.Errorf("%d handled, want the %d replayed before the stop", h, p.Replayed)
				}
				return nil
			})
			l, err := q.List(ctx, dlq.ListOptions{Limit: n})
			if err != nil {
				t.Fatal(err)
			}
			if len(l.DeadLetters) != len(rest)-p.Replayed {
				t.Errorf("after the stop: %d listed, want %d", len(l.DeadLetters), len(rest)-p.Replayed)
			}
			for _, d := range l.DeadLetters {
				if slices.Contains(k5, d.ID) {
					t.Errorf("deleted %s is listed", d.ID)
				}
			}

			p2, err := q.Replay(ctx, dlq.ReplayOptions{})
			if err != nil || p2.Replayed != len(rest)-p.Replayed {
				t.Fatalf("second replay: %+v, %v; want %d", p2, err, len(rest)-p.Replayed)
			}
			svc.WaitHandled(t, rest)
		})
	}
}

package rabbitbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// failOnce is a handler that fails the first attempt of every message and
// counts the IDs it handled after that.
type failOnce struct {
	mu      sync.Mutex
	tried   map[string]bool
	handled map[string]int
}

func newFailOnce() *failOnce {
	return &failOnce{tried: map[string]bool{}, handled: map[string]int{}}
}

func (f *failOnce) handle(_ context.Context, m *omnibus.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.tried[m.ID] {
		f.tried[m.ID] = true
		return errors.New("first attempt fails")
	}
	f.handled[m.ID]++
	return nil
}

// missing returns the IDs of ids not handled yet.
func (f *failOnce) missing(ids []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, id := range ids {
		if f.handled[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

func publishIDs(ctx context.Context, t testing.TB, c *omnibus.Client, topic, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	ms := make([]*omnibus.Message, n)
	for i := range ms {
		ids[i] = prefix + strconv.Itoa(i)
		ms[i] = &omnibus.Message{ID: ids[i], Key: "k" + strconv.Itoa(i%7), Body: []byte("retry")}
	}
	if err := c.Publish(ctx, topic, ms...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return ids
}

// retryQueues returns the retry queues the client declared.
func retryQueues(c *omnibus.Client) []string {
	var out []string
	for _, n := range c.Driver().(*conn).declaredNames() {
		if name, ok := strings.CutPrefix(n, "q:"); ok && strings.Contains(name, ":retry:") {
			out = append(out, name)
		}
	}
	return out
}

// A retry travels through a retry queue. When that queue is gone (an
// operator deleted it, a throwaway group's queue expired), the retry must
// not be confirmed and the original acknowledged: the message would be
// lost. Every message failed once must come back.
func TestRetryQueueDeletedLosesNothing(t *testing.T) {
	for _, qt := range []string{"classic", "quorum"} {
		t.Run(qt, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := open(ctx, t, "queue_type="+qt)
			topic := "omnibus-retrylost-" + strings.ToLower(omnibus.NewID())
			f := newFailOnce()
			k, err := c.Subscribe(ctx, topic, f.handle, omnibus.Group("g"), omnibus.Order(omnibus.OrderNone),
				omnibus.Backoff(200*time.Millisecond, 200*time.Millisecond), omnibus.MaxAttempts(50))
			if err != nil {
				t.Fatal(err)
			}
			transporttest.RunConsumer(t, k)

			// Every retry queue the group uses gets declared (and cached).
			warm := publishIDs(ctx, t, c, topic, "warm-", 40)
			transporttest.Eventually(t, time.Minute, func() bool { return len(f.missing(warm)) == 0 }, func() string {
				return fmt.Sprintf("warm-up: %d of %d not handled", len(f.missing(warm)), len(warm))
			})
			queues := retryQueues(c)
			if len(queues) == 0 {
				t.Fatal("no retry queue declared")
			}
			ac, ch := rawChannel(t)
			defer ac.Close()
			for _, q := range queues {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Fatalf("deleting %s: %v", q, err)
				}
			}
			t.Logf("deleted %v", queues)

			ids := publishIDs(ctx, t, c, topic, "after-", 100)
			transporttest.Eventually(t, time.Minute, func() bool { return len(f.missing(ids)) == 0 }, func() string {
				miss := f.missing(ids)
				return fmt.Sprintf("%d of %d messages failed once never came back (lost), e.g. %v", len(miss), len(ids), miss[:min(3, len(miss))])
			})
		})
	}
}

// Retry queues dead-letter at least once on quorum queues, and a
// throwaway group's retry queues expire once unused, but never before
// what they hold has gone back to the group's queue. Declaring a queue
// with exactly the arguments expected succeeds only when the server holds
// the same values (RabbitMQ compares every argument that matters,
// present or not).
func TestRetryQueueArguments(t *testing.T) {
	for _, tt := range []struct {
		name, params string
		group        string // "" for a throwaway group
	}{
		{"quorum", "queue_type=quorum", "g"},
		{"classic throwaway", "", ""},
		{"quorum throwaway", "queue_type=quorum", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := open(ctx, t, tt.params)
			topic := "omnibus-retryargs-" + strings.ToLower(omnibus.NewID())
			f := newFailOnce()
			opts := []omnibus.SubscribeOption{omnibus.Order(omnibus.OrderNone), omnibus.Backoff(time.Second, time.Second)}
			if tt.group != "" {
				opts = append(opts, omnibus.Group(tt.group))
			}
			k, err := c.Subscribe(ctx, topic, f.handle, opts...)
			if err != nil {
				t.Fatal(err)
			}
			transporttest.RunConsumer(t, k)
			ids := publishIDs(ctx, t, c, topic, "m-", 1)
			transporttest.Eventually(t, 30*time.Second, func() bool { return len(f.missing(ids)) == 0 }, func() string { return "the retried message never came back" })
			queues := retryQueues(c)
			if len(queues) != 1 {
				t.Fatalf("retry queues %v, want one", queues)
			}
			q := queues[0]
			ms, err := strconv.Atoi(strings.TrimSuffix(q[strings.LastIndex(q, ":")+1:], "ms"))
			if err != nil {
				t.Fatalf("retry queue name %q: %v", q, err)
			}
			qtype := "classic"
			if strings.Contains(tt.params, "quorum") {
				qtype = "quorum"
			}
			want := amqp.Table{
				amqp.QueueTypeArg:           qtype,
				"x-message-ttl":             int64(ms),
				"x-dead-letter-exchange":    "",
				"x-dead-letter-routing-key": groupQueue(topic, k.Group()),
			}
			if qtype == "quorum" {
				want["x-dead-letter-strategy"] = "at-least-once"
				want["x-overflow"] = "reject-publish"
			}
			if tt.group == "" {
				want["x-expires"] = int32(int64(ms) + EphemeralExpiry.Milliseconds())
			}
			ac, ch := rawChannel(t)
			defer ac.Close()
			if _, err := ch.QueueDeclare(q, true, false, false, false, want); err != nil {
				t.Fatalf("retry queue %s does not have the arguments %v: %v", q, want, err)
			}
		})
	}
}

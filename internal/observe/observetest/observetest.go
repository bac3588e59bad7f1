// Package observetest gives the metrics and tracing packages' tests the
// transports they run on, each with a fresh namespace and its cleanup.
// Only tests import it.
package observetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	_ "github.com/omnibus-go/omnibus/kafkabus"  // kafka://
	_ "github.com/omnibus-go/omnibus/membus"    // mem://
	_ "github.com/omnibus-go/omnibus/natsbus"   // nats://
	_ "github.com/omnibus-go/omnibus/rabbitbus" // amqp://
)

// Transport is one transport the tests run on.
type Transport struct {
	Name string
	// URL returns the transport's URL for test t, and registers the
	// removal of what the test creates under namespace ns.
	URL func(t testing.TB, ns string) string
}

var (
	rabbitURL  = testenv.Getenv("RABBITBUS_URL", "amqp://guest:guest@127.0.0.1:5672/")
	rabbitAddr = testenv.Getenv("RABBITBUS_ADDR", "127.0.0.1:5672")
)

// kafkaParams make group membership react in test time.
const kafkaParams = "heartbeat_interval=100ms&session_timeout=10s&rebalance_timeout=20s&fetch_max_wait=100ms&metadata_max_age=1s"

// Transports are membus, Kafka (kfake, 3 brokers in the process),
// RabbitMQ (the shared server; required in CI) and NATS JetStream (the
// embedded server, in a directory of the test's).
var Transports = []Transport{
	{Name: "membus", URL: func(t testing.TB, ns string) string { return "mem://" + ns }},
	{Name: "kafka", URL: func(t testing.TB, ns string) string {
		c, err := kfake.NewCluster(kfake.NumBrokers(3))
		if err != nil {
			t.Fatalf("kfake: %v", err)
		}
		t.Cleanup(c.Close)
		return "kafka://" + strings.Join(c.ListenAddrs(), ",") + "?" + kafkaParams
	}},
	{Name: "rabbitmq", URL: func(t testing.TB, ns string) string {
		testenv.Require(t, "RabbitMQ", rabbitAddr, "rabbitmq-server -detached")
		t.Cleanup(func() { deleteRabbit(t, ns) })
		return rabbitURL
	}},
	{Name: "nats", URL: func(t testing.TB, ns string) string {
		return "nats://embedded?dir=" + t.TempDir()
	}},
}

// Namespace returns a name no other run uses, to start topics and groups
// with.
func Namespace() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "ot" + hex.EncodeToString(b[:])
}

// Open opens a client on rawURL with opts, closed at cleanup.
func Open(t testing.TB, rawURL string, opts ...omnibus.Option) *omnibus.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, rawURL, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", omnibus.RedactURL(rawURL), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Eventually polls fn until it returns nil, failing the test with fn's
// last error after d.
func Eventually(t testing.TB, d time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deleteRabbit removes the exchanges and queues whose names start with
// ns.
func deleteRabbit(t testing.TB, ns string) { testenv.DeleteRabbit(t, rabbitURL, ns) }

// Workload is the known workload of the metrics tests, on a consumer of
// one group: 10 messages published in one call, of which one fails its
// first attempt (a retry) and one fails for good (a dead letter), all 10
// settled; then 3 more in a second call, which the handler holds until
// Release.
type Workload struct {
	Consumer *omnibus.Consumer
	release  chan struct{}
}

// StartWorkload subscribes group to topic on c (with opts), runs the
// consumer and publishes the workload; it returns once the 10 first
// messages are settled and the 3 held ones are published. The consumer
// is closed at cleanup.
func StartWorkload(t testing.TB, ctx context.Context, c *omnibus.Client, topic, group string, opts ...omnibus.SubscribeOption) *Workload {
	t.Helper()
	w := &Workload{release: make(chan struct{})}
	start := omnibus.StartLatest // the group's queue is made at Subscribe, before the publishes
	if c.Capabilities().Replay {
		start = omnibus.StartEarliest
	}
	var settled atomic.Int64
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		switch string(m.Body) {
		case "retry":
			if m.Attempt == 1 {
				return errors.New("once")
			}
		case "dead":
			return omnibus.Permanent(errors.New("poison"))
		case "hold":
			select {
			case <-w.release:
			case <-ctx.Done():
			}
		}
		return nil
	}, append([]omnibus.SubscribeOption{omnibus.Group(group), omnibus.StartFrom(start), omnibus.Backoff(time.Millisecond, time.Millisecond),
		omnibus.Observe(func(e omnibus.Event) {
			if e.Kind == omnibus.EventProcessed || e.Kind == omnibus.EventDeadLettered {
				settled.Add(1)
			}
		})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	w.Consumer = k
	t.Cleanup(func() { _ = k.Close() })
	go k.Run(ctx)
	var first []*omnibus.Message
	for i := range 10 {
		body := map[int]string{3: "retry", 7: "dead"}[i]
		if body == "" {
			body = "ok"
		}
		first = append(first, &omnibus.Message{Key: fmt.Sprint("k", i), Body: []byte(body)})
	}
	if err := c.Publish(ctx, topic, first...); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, func() error {
		if n := settled.Load(); n != 10 {
			return fmt.Errorf("%d settled, want 10", n)
		}
		return nil
	})
	held := []*omnibus.Message{{Key: "h1", Body: []byte("hold")}, {Key: "h2", Body: []byte("hold")}, {Key: "h3", Body: []byte("hold")}}
	if err := c.Publish(ctx, topic, held...); err != nil {
		t.Fatal(err)
	}
	return w
}

// Release lets the handler finish the held messages.
func (w *Workload) Release() { close(w.release) }

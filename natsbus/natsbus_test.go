package natsbus_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

const startNATS = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log"

// externalURL is the machine's NATS server (NATS_URL overrides it).
func externalURL(t testing.TB) string {
	t.Helper()
	raw := testenv.Getenv("NATS_URL", "nats://127.0.0.1:4222")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("NATS_URL %q: %v", raw, err)
	}
	testenv.Require(t, "NATS server with JetStream", u.Host, startNATS)
	return raw
}

var topicRE = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// topicName is a fresh topic named after the test; cleanupTopic deletes
// its streams (the topic's and its dead-letter topic's) afterwards.
func topicName(t testing.TB, serverURL string) string {
	t.Helper()
	topic := "t-" + topicRE.ReplaceAllString(t.Name(), "-") + "-" + omnibus.NewID()[12:]
	t.Cleanup(func() { deleteStreams(t, serverURL, topic) })
	return topic
}

// deleteStreams removes every stream whose name starts with the
// topic's stream name, and its groups' lease buckets.
func deleteStreams(t testing.TB, serverURL, topic string) {
	if strings.Contains(serverURL, natsbus.EmbeddedHost) {
		return // the embedded server's store goes away with it
	}
	prefix := topicRE.ReplaceAllString(topic, "_")
	deleteStreamsWhere(t, serverURL, func(n string) bool {
		return strings.HasPrefix(n, prefix) || strings.HasPrefix(n, "KV_"+prefix)
	})
}

// deleteStreamsWhere removes the streams of the server whose names match.
func deleteStreamsWhere(t testing.TB, serverURL string, match func(name string) bool) {
	nc, err := nats.Connect(serverURL, nats.Timeout(2*time.Second))
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var del []string
	for n := range js.StreamNames(ctx).Name() {
		if match(n) {
			del = append(del, n)
		}
	}
	for _, n := range del {
		_ = js.DeleteStream(ctx, n)
	}
}

// eventually polls fn until it returns nil or timeout passes.
func eventually(t testing.TB, timeout time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// collector records the IDs a handler saw.
type collector struct {
	mu   sync.Mutex
	seen map[string]int
	msgs []*omnibus.Message
}

func newCollector() *collector { return &collector{seen: map[string]int{}} }

func (c *collector) handle(_ context.Context, m *omnibus.Message) error {
	c.mu.Lock()
	c.seen[m.ID]++
	cp := *m // the engine clears Body after settlement
	cp.Body = append([]byte(nil), m.Body...)
	c.msgs = append(c.msgs, &cp)
	c.mu.Unlock()
	return nil
}

func (c *collector) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func (c *collector) waitFor(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() error {
		if got := c.unique(); got < n {
			return fmt.Errorf("received %d unique messages, want %d", got, n)
		}
		return nil
	})
}

func publishN(t testing.TB, c *omnibus.Client, topic string, n, size int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ids := make([]string, 0, n)
	body := make([]byte, size)
	const batch = 500
	for i := 0; i < n; i += batch {
		var ms []*omnibus.Message
		for j := i; j < min(n, i+batch); j++ {
			ms = append(ms, &omnibus.Message{Key: fmt.Sprintf("k%d", j%16), Body: body})
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

func testRoundTrip(t *testing.T, serverURL string) {
	topic := topicName(t, serverURL)
	pub := transporttest.Open(t, serverURL)
	sub := transporttest.Open(t, serverURL)
	ctx := context.Background()
	col := newCollector()
	k, err := sub.Subscribe(ctx, topic, col.handle, omnibus.Group("g1"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	when := time.Date(2025, 1, 2, 3, 4, 5, 6789, time.UTC)
	m := &omnibus.Message{ID: "id-1", Key: "k", Type: "order.created", Source: "/shop", Time: when,
		Headers: map[string]string{"traceparent": "00-abc-def-01", "x-multi": "a\nb"}, Body: []byte("hello")}
	if err := pub.Publish(ctx, topic, m); err != nil {
		t.Fatal(err)
	}
	publishN(t, pub, topic, 999, 100)
	col.waitFor(t, 1000, 30*time.Second)
	col.mu.Lock()
	defer col.mu.Unlock()
	var got *omnibus.Message
	for _, x := range col.msgs {
		if x.ID == "id-1" {
			got = x
		}
	}
	if got == nil {
		t.Fatal("message id-1 not received")
	}
	if got.Key != "k" || got.Type != "order.created" || got.Source != "/shop" || !got.Time.Equal(when) ||
		string(got.Body) != "hello" || got.Headers["traceparent"] != "00-abc-def-01" || got.Headers["x-multi"] != "a b" || got.Attempt != 1 {
		t.Errorf("got %+v", got)
	}
}

func TestRoundTripExternal(t *testing.T) { testRoundTrip(t, externalURL(t)) }
func TestRoundTripEmbedded(t *testing.T) { testRoundTrip(t, natsbus.EmbeddedURL(t.TempDir())) }

// startServer starts a nats-server with JetStream on a free loopback
// port, with opts' users, TLS and authorization (it sets the rest:
// Host, Port, JetStream, StoreDir, NoLog, NoSigs), and stops it at
// cleanup.
func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir = "127.0.0.1", server.RANDOM_PORT, true, t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("the NATS server did not start")
	}
	return s
}

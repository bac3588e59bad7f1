// Package observetest gives the metrics and tracing packages' tests the
// transports they run on, each with a fresh namespace and its cleanup.
// Only tests import it.
package observetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
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
// ns. AMQP cannot list them: rabbitmqctl does.
func deleteRabbit(t testing.TB, ns string) {
	list := func(what string) []string {
		out, err := exec.Command("rabbitmqctl", "list_"+what, "-q", "--no-table-headers", "name").Output()
		if err != nil {
			t.Errorf("cleanup: rabbitmqctl list_%s: %v; delete what starts with %q by hand", what, err, ns)
			return nil
		}
		var names []string
		for n := range strings.FieldsSeq(string(out)) {
			if strings.HasPrefix(n, ns) {
				names = append(names, n)
			}
		}
		return names
	}
	queues, exchanges := list("queues"), list("exchanges")
	ac, err := amqp.Dial(rabbitURL)
	if err != nil {
		t.Logf("cleanup: dial: %v", err)
		return
	}
	defer ac.Close()
	ch, err := ac.Channel()
	if err != nil {
		t.Logf("cleanup: channel: %v", err)
		return
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			t.Logf("cleanup: delete queue %s: %v", q, err)
			return
		}
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			t.Logf("cleanup: delete exchange %s: %v", x, err)
			return
		}
	}
}

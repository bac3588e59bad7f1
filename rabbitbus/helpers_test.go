package rabbitbus

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// The server the tests use. RABBITBUS_URL overrides it.
var (
	testURL  = testenv.Getenv("RABBITBUS_URL", "amqp://guest:guest@127.0.0.1:5672/")
	testAddr = testenv.Getenv("RABBITBUS_ADDR", "127.0.0.1:5672")
)

const howToStart = "rabbitmq-server -detached && rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"

func requireServer(t testing.TB) {
	t.Helper()
	testenv.Require(t, "RabbitMQ", testAddr, howToStart)
}

// open opens a client on the test server with extra URL parameters and
// deletes, at cleanup, every exchange and queue it declared.
func open(ctx context.Context, t testing.TB, params string) *omnibus.Client {
	t.Helper()
	requireServer(t)
	u := testURL
	if params != "" {
		u += "?" + params
	}
	return openURL(ctx, t, u)
}

// openURL opens a client on u and, at cleanup, deletes every exchange
// and queue it declared.
func openURL(ctx context.Context, t testing.TB, u string) *omnibus.Client {
	t.Helper()
	c, err := omnibus.Open(ctx, u)
	if errors.Is(err, omnibus.ErrUnsupported) && strings.Contains(u, "partitions=") {
		testenv.SkipOrFail(t, "missing plugin", fmt.Sprintf("partitioned mode needs RabbitMQ's consistent-hash exchange (%v); enable it with: %s", err, testenv.EnableHashPlugin))
	}
	if err != nil {
		t.Fatalf("Open(%q): %v", u, err)
	}
	dc := c.Driver().(*conn)
	t.Cleanup(func() {
		_ = c.Close()
		deleteTopology(t, dc.declaredNames())
	})
	return c
}

// rawChannel opens an amqp091 connection and channel of the test's own
// to the server; the caller closes the connection.
func rawChannel(t testing.TB) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	requireServer(t)
	ac, err := amqp.Dial(testURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ac, ch
}

// deleteTopology deletes the exchanges ("x:name") and queues ("q:name")
// named, on a connection of its own.
func deleteTopology(t testing.TB, names []string) {
	t.Helper()
	if len(names) == 0 {
		return
	}
	ac, err := amqp.Dial(testURL)
	if err != nil {
		t.Logf("cleanup: dial: %v", err)
		return
	}
	defer ac.Close()
	for _, n := range names {
		ch, err := ac.Channel()
		if err != nil {
			t.Logf("cleanup: channel: %v", err)
			return
		}
		kind, name, _ := strings.Cut(n, ":")
		if kind == "q" {
			_, err = ch.QueueDelete(name, false, false, false)
		} else {
			err = ch.ExchangeDelete(name, false, false)
		}
		if err != nil {
			t.Logf("cleanup: delete %s: %v", n, err)
		}
		_ = ch.Close()
	}
}

var restartMu sync.Mutex

// stopApp stops the broker application and returns a function that
// starts it again and waits until the port answers AMQP; the function
// is also registered as a cleanup, so the broker is restored even when
// the test fails. It is safe to call the function more than once.
func stopApp(t testing.TB) (start func()) {
	t.Helper()
	restartMu.Lock()
	var once sync.Once
	start = func() {
		once.Do(func() {
			defer restartMu.Unlock()
			if out, err := exec.Command("rabbitmqctl", "start_app").CombinedOutput(); err != nil {
				t.Errorf("rabbitmqctl start_app: %v: %s", err, out)
			}
			deadline := time.Now().Add(90 * time.Second)
			for time.Now().Before(deadline) {
				if ac, err := amqp.Dial(testURL); err == nil {
					_ = ac.Close()
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Errorf("RabbitMQ did not answer on %s within 90s of start_app", testAddr)
		})
	}
	t.Cleanup(start)
	if out, err := exec.Command("rabbitmqctl", "stop_app").CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl stop_app: %v: %s", err, out)
	}
	return start
}

// restart stops and starts the broker application.
func restart(ctx context.Context, t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("SKIP: rabbitmqctl not found; cannot restart the broker")
	}
	start := stopApp(t)
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	start()
}

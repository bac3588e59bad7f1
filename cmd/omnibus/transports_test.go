package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// kafkaTestParams make group membership react in test time.
const kafkaTestParams = "heartbeat_interval=100ms&session_timeout=10s&rebalance_timeout=20s&fetch_max_wait=100ms&metadata_max_age=1s&create_topics=all"

// kafkaURL starts an in-process Kafka (kfake), closed at cleanup.
func kafkaURL(t testing.TB) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return "kafka://" + strings.Join(c.ListenAddrs(), ",") + "?" + kafkaTestParams
}

// serverURL returns raw when its server answers on addr. When it does
// not, the test fails in CI and is skipped elsewhere, saying how to start
// it.
func serverURL(t testing.TB, raw, addr, howToStart string) string {
	t.Helper()
	testenv.Require(t, raw[:strings.Index(raw, ":")], addr, howToStart)
	return raw
}

const (
	startNATS   = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server"
	startRabbit = "rabbitmq-server -detached"
)

// requireHashPlugin returns raw, a partitioned RabbitMQ URL, when the
// server has the consistent-hash exchange plugin enabled; otherwise the
// test fails in CI and is skipped elsewhere, saying how to enable it.
func requireHashPlugin(t testing.TB, raw string) string {
	t.Helper()
	c, err := omnibus.Open(ctxT(t), raw)
	if errors.Is(err, omnibus.ErrUnsupported) {
		testenv.SkipOrFail(t, "missing plugin", fmt.Sprintf("partitioned mode needs RabbitMQ's consistent-hash exchange (%v); enable it with: %s", err, testenv.EnableHashPlugin))
	}
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	return raw
}

// cleanNATS deletes, at cleanup, the streams on the shared server whose
// names contain part: a test's topics and their groups' buckets.
func cleanNATS(t testing.TB, part string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nc, err := nats.Connect("nats://127.0.0.1:4222")
		if err != nil {
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return
		}
		names := js.StreamNames(ctx)
		var doomed []string
		for name := range names.Name() {
			if strings.Contains(name, part) {
				doomed = append(doomed, name)
			}
		}
		for _, name := range doomed {
			_ = js.DeleteStream(ctx, name)
		}
	})
}

// cleanRabbit deletes, at cleanup, the queues and exchanges on the shared
// server whose names start with prefix: a test's topics and their groups'
// queues (names from rabbitmqctl, which AMQP cannot list).
func cleanRabbit(t testing.TB, prefix string) {
	t.Cleanup(func() {
		conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
		if err != nil {
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		for _, kind := range []string{"list_queues", "list_exchanges"} {
			out, err := exec.Command("rabbitmqctl", kind, "-q", "--no-table-headers", "name").Output()
			if err != nil {
				t.Logf("cleanup: rabbitmqctl %s: %v", kind, err)
				return
			}
			for _, name := range strings.Fields(string(out)) {
				if !strings.HasPrefix(name, prefix) {
					continue
				}
				if kind == "list_queues" {
					_, err = ch.QueueDelete(name, false, false, false)
				} else {
					err = ch.ExchangeDelete(name, false, false)
				}
				if err != nil {
					return
				}
			}
		}
	})
}

// TestDemoOnEveryTransport runs the same demo by URL on each transport;
// it removes what it made there: what the server holds named after the
// run, read with the transport's own client, is nothing.
func TestDemoOnEveryTransport(t *testing.T) {
	tests := []struct {
		name    string
		url     func(t testing.TB) string
		ordered bool
		holds   func(t testing.TB, raw, run string) []string
	}{
		{"kafka (kfake)", kafkaURL, true, func(t testing.TB, raw, run string) []string {
			return append(kafkaHolds(t, raw, "demo.orders."+run, "omnibus-demo-"+run), kafkaHolds(t, raw, "omnibus-demo-dlq-"+run, "")...)
		}},
		{"nats partitioned", func(t testing.TB) string {
			cleanNATS(t, "demo_orders")
			return serverURL(t, "nats://127.0.0.1:4222?partitions=4&lease_ttl=2s&rebalance_interval=100ms", "127.0.0.1:4222", startNATS)
		}, true, func(t testing.TB, raw, run string) []string {
			return natsHolds(t, raw, "demo_orders_"+run, "omnibus-demo")
		}},
		{"rabbitmq partitioned", func(t testing.TB) string {
			cleanRabbit(t, "demo.orders.")
			return requireHashPlugin(t, serverURL(t, "amqp://guest:guest@127.0.0.1:5672/?partitions=4", "127.0.0.1:5672", startRabbit))
		}, true, func(t testing.TB, raw, run string) []string { return rabbitHolds(t, raw, "demo.orders."+run, "") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := tt.url(t)
			r := runCmd(t, ctxT(t), nil, "", "demo", "--url", raw, "--orders", "300", "--customers", "6",
				"--rate", "1000", "--work", "1ms", "--lanes", "4")
			want := 3
			if tt.ordered {
				want = 4
			}
			wantVerified(t, r, want)
			if strings.Contains(r.stdout, "guest:guest") {
				t.Errorf("output shows the password:\n%s", r.stdout)
			}
			wantDemoRemoved(t, r, func(run string) []string { return tt.holds(t, raw, run) })
		})
	}
}

// TestSendTailBenchKafka: send and tail by URL across separate commands
// (the server outlives them), and bench.
func TestSendTailBenchKafka(t *testing.T) {
	raw := kafkaURL(t)
	r := runCmd(t, ctxT(t), nil, "a\nb\nc\n", "send", "--url", raw, "--topic", "k", "--key", "x")
	wantCode(t, r, exitOK)
	r = runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", "k", "--from", "earliest", "--max", "3", "--json")
	wantCode(t, r, exitOK)
	var bodies []string
	for _, m := range decodeLines(t, r.stdout) {
		bodies = append(bodies, m.Body)
	}
	if got := strings.Join(bodies, ""); got != "abc" {
		t.Errorf("tail read %q, want abc", got)
	}
	m := benchJSON(t, runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "500", "--json"))
	if m["transport"] != "kafka" {
		t.Errorf("transport %v, want kafka", m["transport"])
	}
}

func TestWrongPasswordHidden(t *testing.T) {
	const secret = "wr0ng-pa55"
	raw := serverURL(t, "amqp://guest:"+secret+"@127.0.0.1:5672/", "127.0.0.1:5672", startRabbit)
	r := runCmd(t, ctxT(t), nil, "", "send", "--url", raw, "--topic", "t", "--count", "1")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, "rabbitbus", secret)
}

// TestLagKafka reads a real group's lag from outside it: after a group
// consumed 20 of 50 messages and left, 30 remain and the lanes with lag
// are STOP (no members).
func TestLagKafka(t *testing.T) {
	raw := kafkaURL(t)
	r := runCmd(t, ctxT(t), nil, "", "send", "--url", raw, "--topic", "lagged", "--count", "50", "--size", "10", "--keys", "10")
	wantCode(t, r, exitOK)
	r = runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", "lagged", "--group", "g", "--from", "earliest", "--max", "20")
	wantCode(t, r, exitOK)
	r = runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "lagged", "--group", "g", "--json", "--samples", "2", "--interval", "10ms")
	wantCode(t, r, exitOK)
	var rep lagReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("output %q: %v", r.stdout, err)
	}
	if rep.Total != 30 || rep.Status != statusStop || len(rep.Lanes) == 0 {
		t.Errorf("report %s: want total 30, status STOP", r.stdout)
	}
	r = runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", "lagged", "--group", "nobody", "--interval", "10ms")
	wantCode(t, r, exitFailed)
	wantOneLineError(t, r, "not found", "")
}

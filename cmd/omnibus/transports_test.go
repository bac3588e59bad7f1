package main

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
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

// serverURL returns raw when its server answers on addr, and skips the
// test, naming the server, when it does not.
func serverURL(t testing.TB, raw, addr string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		t.Skipf("no server on %s (%v): skipping %s", addr, err, raw)
	}
	conn.Close()
	return raw
}

// TestDemoOnEveryTransport runs the same demo by URL on each transport.
func TestDemoOnEveryTransport(t *testing.T) {
	tests := []struct {
		name    string
		url     func(t testing.TB) string
		ordered bool
	}{
		{"kafka (kfake)", kafkaURL, true},
		{"nats", func(t testing.TB) string { return serverURL(t, "nats://127.0.0.1:4222", "127.0.0.1:4222") }, false},
		{"rabbitmq partitioned", func(t testing.TB) string {
			return serverURL(t, "amqp://guest:guest@127.0.0.1:5672/?partitions=4", "127.0.0.1:5672")
		}, true},
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
	raw := serverURL(t, "amqp://guest:"+secret+"@127.0.0.1:5672/", "127.0.0.1:5672")
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

package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const startRedis = "redis-server --bind 127.0.0.1 --port 6379 --save '' --daemonize yes"

// redisURL is the shared Redis server with params, after arranging that
// the keys of the topics the test makes (they start with prefix) are
// deleted at its end.
func redisURL(t testing.TB, params, prefix string) string {
	t.Helper()
	raw := serverURL(t, "redis://127.0.0.1:6379"+params, "127.0.0.1:6379", startRedis)
	t.Cleanup(func() {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		it := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			_ = rdb.Del(ctx, it.Val()).Err()
		}
	})
	return raw
}

// TestRedisCommands runs the demo, send, tail, lag and bench on
// redis:// by URL, across separate commands.
func TestRedisCommands(t *testing.T) {
	t.Run("demo partitioned", func(t *testing.T) {
		raw := redisURL(t, "?partitions=4&lease_ttl=2s&rebalance_interval=100ms", "demo.orders.")
		r := runCmd(t, ctxT(t), nil, "", "demo", "--url", raw, "--orders", "300", "--customers", "6",
			"--rate", "1000", "--work", "1ms", "--lanes", "4")
		wantVerified(t, r, 4)
		wantDemoRemoved(t, r, func(run string) []string { return redisHolds(t, raw, "demo.orders."+run, "") })
	})
	t.Run("send tail lag bench", func(t *testing.T) {
		topic := "omnibus-cli-" + shortID()
		raw := redisURL(t, "", topic)
		r := runCmd(t, ctxT(t), nil, "a\nb\nc\n", "send", "--url", raw, "--topic", topic, "--key", "x")
		wantCode(t, r, exitOK)
		r = runCmd(t, ctxT(t), nil, "", "tail", "--url", raw, "--topic", topic, "--group", "g", "--from", "earliest", "--max", "2", "--json")
		wantCode(t, r, exitOK)
		var bodies []string
		for _, m := range decodeLines(t, r.stdout) {
			bodies = append(bodies, m.Body)
		}
		if got := strings.Join(bodies, ""); got != "ab" {
			t.Errorf("tail read %q, want ab", got)
		}
		r = runCmd(t, ctxT(t), nil, "", "lag", "--url", raw, "--topic", topic, "--group", "g", "--samples", "1", "--json")
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, `"total":1`) {
			t.Errorf("lag after reading 2 of 3: %s, want a total of 1", r.stdout)
		}
		m := benchJSON(t, runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "500", "--json"))
		if m["transport"] != "redis" {
			t.Errorf("transport %v, want redis", m["transport"])
		}
	})
}

// TestRedisDemoSurvivesAFreeze: the partitioned demo's process is stopped
// (SIGSTOP) for longer than its leases live, then continued. Its members
// find every lane lost at once and claim them again, while their reads
// are in flight; every order must still be processed and every poison
// order dead-lettered, nothing left pending in a member's name.
func TestRedisDemoSurvivesAFreeze(t *testing.T) {
	raw := redisURL(t, "?partitions=4&lease_ttl=2s&rebalance_interval=100ms", "demo.orders.")
	p := start(t, freshUser(t), "", "demo", "--url", raw, "--orders", "300", "--customers", "6",
		"--rate", "100", "--work", "1ms", "--lanes", "4")
	p.waitOutput("scaling consumers", time.Minute)
	time.Sleep(300 * time.Millisecond)
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // 2.5 lease lives
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wantVerified(t, p.wait(2*time.Minute), 4)
}

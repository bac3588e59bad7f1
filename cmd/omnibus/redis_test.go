package main

import (
	"context"
	"strings"
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
		bench := "omnibus-bench-"
		_ = redisURL(t, "", bench)
		m := benchJSON(t, runCmd(t, ctxT(t), nil, "", "bench", "--url", raw, "--count", "500", "--json"))
		if m["transport"] != "redis" {
			t.Errorf("transport %v, want redis", m["transport"])
		}
	})
}

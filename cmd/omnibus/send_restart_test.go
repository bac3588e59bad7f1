package main

import (
	"context"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/rabbitnode"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestSendRidesThroughBrokerRestart restarts a RabbitMQ node of the
// test's own while send publishes 20,000 messages: send exits 0, says
// how many publishes it tried again (if any was in flight when the
// broker went down), and a consumer group gets every
// message (a copy of one published again after an unknown outcome is
// counted as a duplicate, never as a loss).
func TestSendRidesThroughBrokerRestart(t *testing.T) {
	node := rabbitnode.Start(t)
	raw := node.URL("")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	sub, err := omnibus.Open(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var mu sync.Mutex
	seen := map[string]int{}
	k, err := sub.Subscribe(ctx, "restart", func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		seen[m.ID]++
		mu.Unlock()
		return nil
	}, omnibus.Group("count"), omnibus.MaxInFlight(256))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- k.Run(rctx) }()
	defer func() { rcancel(); <-runDone }()
	unique := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}

	const n = 20000
	sent := make(chan result, 1)
	go func() {
		sent <- runCmd(t, ctx, nil, "", "send", "--url", raw, "--topic", "restart", "--count", strconv.Itoa(n), "--size", "100", "--keys", "50")
	}()
	transporttest.Eventually(t, 2*time.Minute, func() bool { return unique() >= n/4 }, func() string {
		return "send made no progress before the restart: " + strconv.Itoa(unique()) + " handled"
	})
	at := unique()
	node.Restart()
	r := <-sent
	t.Logf("restarted after %d of %d handled; send: %s", at, n, r.stdout)
	wantCode(t, r, exitOK)
	if !regexp.MustCompile(`^sent 20000, failed 0, `).MatchString(r.stdout) {
		t.Errorf("summary %q, want all 20000 sent and none failed", r.stdout)
	}
	retried := "none"
	if m := regexp.MustCompile(`, retried (\d+),`).FindStringSubmatch(r.stdout); m != nil {
		retried = m[1]
	} else {
		// No publish was in flight when the broker closed the
		// channels (they closed with nothing unconfirmed): later ones
		// waited for the reconnection, and nothing needed sending
		// again. The summary then rightly says nothing of retries.
		t.Logf("summary %q: no publish was retried (none was in flight when the broker went down)", r.stdout)
	}
	transporttest.Eventually(t, 2*time.Minute, func() bool { return unique() == n }, func() string {
		return strconv.Itoa(unique()) + " of " + strconv.Itoa(n) + " messages handled"
	})
	mu.Lock()
	dups := 0
	for _, c := range seen {
		dups += c - 1
	}
	mu.Unlock()
	t.Logf("all %d messages handled, %d duplicate deliveries; %s publishes retried", n, dups, retried)
}

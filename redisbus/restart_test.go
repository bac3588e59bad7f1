package redisbus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestRestart publishes 20,000 messages while a redis-server of the
// test's own (an append-only file, fsynced on every write) restarts
// twice, once while publishing and once while only consuming, and checks
// that the group handles every message the server acknowledged.
// Publishes that fail during a restart are repeated with the same IDs,
// so duplicates are counted, not lost. Partitioned, the key order is
// checked too: no message may come first behind a newer one of its key.
func TestRestart(t *testing.T) {
	for _, mode := range []struct{ name, params string }{
		{"Unpartitioned", "claim_idle=2s"},
		{"Partitioned", "claim_idle=2s&partitions=4&lease_ttl=5s&rebalance_interval=100ms"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			srv := startPrivateServer(t)
			testRestart(t, srv, with(srv.url(), mode.params, "dial_timeout=1s"))
		})
	}
}

func testRestart(t *testing.T, srv *privateServer, rawURL string) {
	const total, keys = 20000, 32
	ctx := context.Background()
	pub, sub := transporttest.Open(t, rawURL), transporttest.Open(t, rawURL)
	topic := "restart"
	var (
		mu       sync.Mutex
		seen     = map[string]int{}
		newest   = map[string]int{}
		disorder []string
	)
	k, err := sub.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		i, _ := strconv.Atoi(strings.TrimPrefix(m.ID, "m-"))
		mu.Lock()
		defer mu.Unlock()
		seen[m.ID]++
		// A publish repeated after a restart appends the batch again
		// (Redis has no duplicate window): only a message's first
		// delivery is held to the order.
		if last, ok := newest[m.Key]; ok && i < last && seen[m.ID] == 1 && len(disorder) < 5 {
			disorder = append(disorder, fmt.Sprintf("%s after m-%05d", m.ID, last))
		}
		newest[m.Key] = max(newest[m.Key], i)
		return nil
	}, omnibus.Group("restart"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	unique := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}

	var published atomic.Int64
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		for i, at := range []int{total / 3, total * 4 / 5} {
			for (i == 0 && published.Load() < int64(at)) || (i == 1 && unique() < at) {
				time.Sleep(time.Millisecond)
			}
			srv.restart(300 * time.Millisecond)
		}
	}()
	body := []byte(strings.Repeat("x", 100))
	retries := 0
	for i := 0; i < total; {
		ms := make([]*omnibus.Message, 100)
		for j := range ms {
			ms[j] = &omnibus.Message{ID: fmt.Sprintf("m-%05d", i+j), Key: "k" + strconv.Itoa((i+j)%keys), Body: body}
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pub.Publish(pctx, topic, ms...)
		cancel()
		if err != nil {
			retries++
			var pe *omnibus.PublishError
			if !errors.As(err, &pe) && !errors.Is(err, context.DeadlineExceeded) && retries < 5 {
				t.Logf("publish (retrying): %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		i += len(ms)
		published.Store(int64(i))
	}
	<-restarted
	waitFor(t, 90*time.Second, func() bool { return unique() == total }, fmt.Sprintf("not every message was handled (%d of %d)", unique(), total))
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	if strings.Contains(rawURL, "partitions=") && len(disorder) > 0 {
		t.Errorf("key order broken across restarts: %v", disorder)
	}
	t.Logf("%d unique IDs handled across 2 restarts, %d handled twice, %d publish calls repeated", len(seen), dups, retries)
}

package rabbitbus

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestRestart restarts the broker application while 20,000 messages with
// unique IDs are published and consumed. Every ID whose Publish returned
// nil must be handled (no silent loss); a batch whose Publish failed is
// published again, so in the end every ID is handled at least once.
func TestRestart(t *testing.T) {
	requireServer(t)
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("SKIP: rabbitmqctl not found; cannot restart the broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pub, sub := open(ctx, t, ""), open(ctx, t, "")
	topic := fmt.Sprintf("omnibus-restart-%x", rand.Uint32())

	var mu sync.Mutex
	handled := map[string]int{}
	k, err := sub.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		handled[m.ID]++
		mu.Unlock()
		return nil
	}, omnibus.Group("restart"), omnibus.MaxInFlight(256))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	runDone := make(chan error, 1)
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go func() { runDone <- k.Run(rctx) }()

	const n, batch = 20000, 100
	var published atomic.Int64
	confirmed := make([]string, 0, n) // IDs whose Publish returned nil
	var failures atomic.Int64
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; i < n; i += batch {
			ms := make([]*omnibus.Message, batch)
			for j := range ms {
				ms[j] = &omnibus.Message{ID: "r-" + strconv.Itoa(i+j), Key: strconv.Itoa((i + j) % 50), Body: []byte("restart")}
			}
			for {
				pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
				err := pub.Publish(pctx, topic, ms...)
				pcancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return
				}
				failures.Add(1) // not silent: retry the whole batch
				time.Sleep(100 * time.Millisecond)
			}
			mu.Lock()
			for _, m := range ms {
				confirmed = append(confirmed, m.ID)
			}
			mu.Unlock()
			published.Add(batch)
		}
	}()

	transporttest.Eventually(t, time.Minute, func() bool { return published.Load() >= n/4 }, func() string {
		return fmt.Sprintf("published %d before the restart", published.Load())
	})
	start := stopApp(t)
	time.Sleep(500 * time.Millisecond)
	start()
	t.Logf("broker restarted after %d published; %d Publish calls failed and were retried", published.Load(), failures.Load())
	select {
	case <-pubDone:
	case <-ctx.Done():
		t.Fatalf("publisher stuck after the restart: %d of %d published", published.Load(), n)
	}
	missing := func() []string {
		mu.Lock()
		defer mu.Unlock()
		var miss []string
		for _, id := range confirmed {
			if handled[id] == 0 {
				miss = append(miss, id)
			}
		}
		return miss
	}
	transporttest.Eventually(t, 2*time.Minute, func() bool { return len(missing()) == 0 }, func() string {
		miss := missing()
		return fmt.Sprintf("%d confirmed messages never handled, e.g. %v", len(miss), miss[:min(5, len(miss))])
	})
	mu.Lock()
	defer mu.Unlock()
	if len(confirmed) != n {
		t.Fatalf("%d of %d IDs confirmed", len(confirmed), n)
	}
	dups := 0
	for _, c := range handled {
		dups += c - 1
	}
	t.Logf("all %d IDs handled; %d duplicate deliveries", n, dups)
	rcancel()
	<-runDone
}

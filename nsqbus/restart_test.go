package nsqbus_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestRestart publishes 20,000 messages while nsqd is stopped and
// started again on its data directory twice, once while publishing and
// once while only consuming: every message whose Publish returned nil
// reaches the group. nsqd writes what it holds in memory, in flight
// included, to its data directory when it stops; a publish that failed
// meanwhile is sent again with the same IDs (duplicates are counted, and
// allowed).
func TestRestart(t *testing.T) {
	const total = 20000
	srv := nsqtest.StartNSQD(t, nsqtest.Config{})
	u := srv.URL(testParams, "msg_timeout=5s")
	pub, sub := transporttest.Open(t, u), transporttest.Open(t, u)
	const topic = "restart"
	col := newCollector()
	k, err := sub.Subscribe(context.Background(), topic, col.handle, omnibus.Group("restart"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)

	var published atomic.Int64
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		for i, at := range []int{total / 3, total * 4 / 5} {
			for (i == 0 && published.Load() < int64(at)) || (i == 1 && col.unique() < at) {
				time.Sleep(time.Millisecond)
			}
			srv.Stop()
			time.Sleep(300 * time.Millisecond)
			if err := srv.Start(); err != nil {
				t.Errorf("start nsqd again: %v", err)
				return
			}
		}
	}()
	ctx := context.Background()
	var ids []string
	retries := 0
	for i := 0; i < total; {
		ms := numbered("restart", i, 100, 100)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pub.Publish(pctx, topic, ms...)
		cancel()
		if err != nil {
			if retries++; retries > 200 {
				t.Fatalf("Publish keeps failing: %v", err)
			}
			var pe *omnibus.PublishError
			if errors.As(err, &pe) {
				t.Logf("publish (retrying): %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		i += len(ms)
		published.Store(int64(i))
	}
	<-restarted
	awaitAll(t, 90*time.Second, ids, col)
	t.Logf("%d unique IDs received across 2 restarts of nsqd, %d redeliveries, %d publish calls retried", col.unique(), col.dups(), retries)
}

package kinesisbus_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// holders counts the lanes each consumer holds.
func holders(ks []*omnibus.Consumer) []int {
	counts := make([]int, len(ks))
	for i, k := range ks {
		if k == nil {
			continue
		}
		for _, l := range k.Stats().Lanes {
			if l.Member >= 0 {
				counts[i]++
			}
		}
	}
	return counts
}

// TestLeasesBalanceAndFailOver: three members (each its own client, as
// three processes) on 8 shards converge to 3/3/2. One is then killed: its
// network is cut and it is closed, so it releases nothing. The others
// take its leases once they have not moved for failover_time (2s), and
// every message published before and after is handled.
//
// It times the takeover, so it runs alone, before the parallel tests.
func TestLeasesBalanceAndFailOver(t *testing.T) {
	need(t)
	const failover = 2 * time.Second
	params := "failover_time=" + failover.String()
	pub := transporttest.Open(t, testURL(""))
	stream := testPrefix + "leases-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := pub.CreateTopic(ctxT(t), stream, 8); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	handler := func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		seen[m.ID] = true
		mu.Unlock()
		return nil
	}
	kin, ddb := newProxy(t, kinesisAddr), newProxy(t, dynamoAddr)
	urls := []string{testURL(params), testURL(params), kinesisURL(kin.Addr(), ddb.Addr(), params)}
	ks := make([]*omnibus.Consumer, 3)
	clients := make([]*omnibus.Client, 3)
	for i, u := range urls {
		clients[i] = transporttest.Open(t, u)
		k, err := clients[i].Subscribe(ctxT(t), stream, handler, omnibus.Group("leases"), omnibus.StartFrom(omnibus.StartEarliest))
		if err != nil {
			t.Fatalf("Subscribe %d: %v", i, err)
		}
		t.Cleanup(func() { _ = k.Close() })
		ks[i] = k
		if i < 2 {
			transporttest.RunConsumer(t, k)
		} else {
			go func() { _ = k.Run(context.Background()) }()
		}
	}
	var ids []string
	publish := func(n int) {
		ms := make([]*omnibus.Message, n)
		for i := range ms {
			ms[i] = &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte("x")}
		}
		if err := pub.Publish(ctxT(t), stream, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
	}
	publish(400)
	transporttest.Eventually(t, 30*time.Second, func() bool {
		c := holders(ks)
		slices.Sort(c)
		return slices.Equal(c, []int{2, 3, 3})
	}, func() string { return fmt.Sprintf("lanes per member %v, want 3/3/2", holders(ks)) })

	// Kill the third member: no release reaches the table.
	killed := time.Now()
	kin.Cut()
	ddb.Cut()
	_ = ks[2].Close()
	_ = clients[2].Close()
	ks[2] = nil
	publish(400)
	transporttest.Eventually(t, 30*time.Second, func() bool {
		c := holders(ks)
		return c[0]+c[1] == 8
	}, func() string { return fmt.Sprintf("lanes per member %v, want all 8 on the two left", holders(ks)) })
	took := time.Since(killed)
	// A lease expires failover_time after the taker last saw it move;
	// the taker looks every failover_time/2.
	if limit := failover + failover/2 + 2*time.Second; took > limit {
		t.Errorf("the killed member's leases were taken after %v, want within %v", took, limit)
	}
	transporttest.Eventually(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= len(ids)
	}, func() string { return fmt.Sprintf("handled %d of %d", len(seen), len(ids)) })
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if !seen[id] {
			t.Fatalf("message %s lost", id)
		}
	}
	c := holders(ks)
	t.Logf("leases taken %v after the kill (failover_time %v); lanes now %v", took.Round(time.Millisecond), failover, c[:2])
}

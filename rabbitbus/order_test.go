package rabbitbus

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestPartitionedKeyOrder runs 3 members of one group, each on a client
// of its own, over a partitioned topic: 10,000 messages on 200 keys must
// each be handled, in order per key, while the members share the lanes.
func TestPartitionedKeyOrder(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const params = "partitions=6&rebalance=300ms"
	pub := open(ctx, t, params)
	topic := fmt.Sprintf("omnibus-order-%x", rand.Uint32())

	var mu sync.Mutex
	seqs := map[string][]int{}          // key -> sequence numbers in handling order
	laneBy := map[string]map[int]bool{} // lane -> members that handled it
	seen := map[string]bool{}
	for i := range 3 {
		c := open(ctx, t, params)
		k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
			seq, _ := strconv.Atoi(m.Headers["seq"])
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			mu.Lock()
			seqs[m.Key] = append(seqs[m.Key], seq)
			if laneBy[m.Lane] == nil {
				laneBy[m.Lane] = map[int]bool{}
			}
			laneBy[m.Lane][i] = true
			seen[m.ID] = true
			mu.Unlock()
			return nil
		}, omnibus.Group("ordered"), omnibus.Order(omnibus.OrderKey), omnibus.MaxInFlight(64))
		if err != nil {
			t.Fatalf("Subscribe member %d: %v", i, err)
		}
		t.Cleanup(func() { _ = k.Close() })
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- k.Run(rctx) }()
		t.Cleanup(func() { rcancel(); <-done })
	}

	const n, keys = 10000, 200
	perKey := make([]int, keys)
	for i := 0; i < n; i += 200 {
		ms := make([]*omnibus.Message, 200)
		for j := range ms {
			k := (i + j) % keys
			ms[j] = &omnibus.Message{Key: "key" + strconv.Itoa(k), Headers: map[string]string{"seq": strconv.Itoa(perKey[k])}, Body: []byte("o")}
			perKey[k]++
		}
		if err := pub.Publish(ctx, topic, ms...); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		if i == n/2 {
			time.Sleep(time.Second) // let the members rebalance mid-stream
		}
	}
	transporttest.Eventually(t, 90*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}, func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("handled %d of %d", len(seen), n)
	})
	mu.Lock()
	defer mu.Unlock()
	for key, s := range seqs {
		for i := 1; i < len(s); i++ {
			// A redelivery repeats an earlier sequence; anything else
			// going backwards, or a gap, is an order violation.
			if s[i] < s[i-1] && !contains(s[:i], s[i]) {
				t.Fatalf("key %q out of order at %d: %v", key, i, s[max(0, i-5):min(len(s), i+5)])
			}
			if s[i] > s[i-1]+1 {
				t.Fatalf("key %q skipped from %d to %d", key, s[i-1], s[i])
			}
		}
	}
	used := map[int]bool{}
	for _, ms := range laneBy {
		for m := range ms {
			used[m] = true
		}
	}
	t.Logf("lanes handled by members: %v", laneBy)
	if len(used) < 2 {
		t.Errorf("only %d of 3 members handled messages; want the lanes shared", len(used))
	}
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

package redisbus_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/redisbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestHeldNotRunIsNotCounted has raw consumers of a group read an entry
// and claim it 4 times (XCLAIM, which counts a delivery), never running
// or acknowledging it, as members that crashed while it waited behind a
// poisoned entry would: its delivery count is then 5. A member with
// MaxAttempts 3 takes it over (count 6) and must run it, with attempt 2
// (the holders that ran it: the first, unrecorded, and this one), not
// dead-letter it; the record is there while the handler runs, and the
// acknowledgement deletes it.
func TestHeldNotRunIsNotCounted(t *testing.T) {
	for _, mode := range []struct {
		name   string
		params string
		parts  int
	}{
		{"unpartitioned", "claim_idle=200ms", 0},
		{"partitioned", "partitions=4&lease_ttl=2s&rebalance_interval=100ms", 4},
	} {
		t.Run(mode.name, func(t *testing.T) { testHeldNotRun(t, mode.params, mode.parts) })
	}
}

func testHeldNotRun(t *testing.T, params string, parts int) {
	base := serverURL(t)
	c := transporttest.Open(t, with(base, params))
	rdb := raw(t, base)
	topic := topicName(t, base)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.CreateTopic(ctx, topic, max(parts, 1)); err != nil {
		t.Fatal(err)
	}
	dlq := topic + ".dlq"
	if err := c.CreateTopic(ctx, dlq, 1); err != nil {
		t.Fatal(err)
	}
	if parts > 0 {
		dlq += ":0"
	}
	// The group, on every stream of the topic, made before the entry.
	streams := []string{topic}
	if parts > 0 {
		streams = streams[:0]
		for p := range parts {
			streams = append(streams, topic+":"+strconv.Itoa(p))
		}
	}
	for _, st := range streams {
		if err := rdb.XGroupCreateMkStream(ctx, st, "g", "$").Err(); err != nil {
			t.Fatalf("XGROUP CREATE %s g: %v", st, err)
		}
	}
	if err := c.Publish(ctx, topic, &omnibus.Message{Key: "k", Body: []byte("held, never run")}); err != nil {
		t.Fatal(err)
	}
	stream := topic
	if parts > 0 {
		stream = streams[driver.Partition("k", parts)]
	}

	// Read by one consumer, claimed by four more: members that held it
	// and died before running it.
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead-1", Streams: []string{stream, ">"}, Count: 1}).Result()
	if err != nil || len(res) != 1 || len(res[0].Messages) != 1 {
		t.Fatalf("XREADGROUP: %v, %v", res, err)
	}
	id := res[0].Messages[0].ID
	for i := 2; i <= 5; i++ {
		got, err := rdb.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: "g", Consumer: fmt.Sprint("dead-", i), Messages: []string{id}}).Result()
		if err != nil || len(got) != 1 {
			t.Fatalf("XCLAIM %d: %v, %v", i, got, err)
		}
	}
	pending, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: id, End: id, Count: 1}).Result()
	if err != nil || len(pending) != 1 || pending[0].RetryCount != 5 {
		t.Fatalf("XPENDING %s: %v, %v; want delivery count 5", id, pending, err)
	}

	runs := redisbus.RunsKey(stream, "g")
	var mu sync.Mutex
	var attempts []int
	var records []string
	k, err := c.Subscribe(ctx, topic, func(ctx context.Context, m *omnibus.Message) error {
		rec, err := rdb.HGet(ctx, runs, id).Result()
		if err != nil {
			rec = err.Error()
		}
		mu.Lock()
		attempts = append(attempts, m.Attempt)
		records = append(records, rec)
		mu.Unlock()
		return nil
	}, omnibus.Group("g"), omnibus.MaxAttempts(3))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(attempts)
		mu.Unlock()
		if n > 0 {
			break
		}
		if dead, _ := rdb.XLen(ctx, dlq).Result(); dead > 0 {
			t.Fatalf("entry %s, read and claimed 5 times and never run, was dead-lettered (MaxAttempts 3)", id)
		}
		if time.Now().After(deadline) {
			t.Fatalf("entry %s, read and claimed 5 times and never run, was not handled", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	if len(attempts) != 1 || attempts[0] != 2 {
		t.Errorf("the handler saw attempts %v, want [2] (the first holder and this one)", attempts)
	}
	// The record: 2 holders, at delivery count 6 (the member's claim).
	if len(records) != 1 || records[0] != "2:6" {
		t.Errorf("the run record while the handler ran: %q, want [2:6]", records)
	}
	mu.Unlock()
	waitFor(t, 10*time.Second, func() bool {
		p, err := rdb.XPending(ctx, stream, "g").Result()
		return err == nil && p.Count == 0
	}, "the entry was not acknowledged")
	if _, err := rdb.HGet(ctx, runs, id).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("the run record of %s after the acknowledgement: %v, want none", id, err)
	}
	if dead, _ := rdb.XLen(ctx, dlq).Result(); dead > 0 {
		t.Errorf("%d entries dead-lettered", dead)
	}
}

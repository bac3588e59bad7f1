package redisbus

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/driver"
)

// TestRunCountRecords goes through the records of CountRun: a new group
// starts without the records a group of its name left; each holder
// counts once per delivery; a record of a later delivery than the
// entry's (another group's or stream's) or one that is no record starts
// over; an entry no longer pending is not recorded; Ack deletes the
// record.
func TestRunCountRecords(t *testing.T) {
	ctx := context.Background()
	c, topic := openTestConn(t, "", "redisbus-runs-")
	runs := runsKey(topic, "g")
	// Left by a group of that name on a stream of that name before.
	if err := c.rdb.HSet(ctx, runs, "1-1", "3:4").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.join(ctx, topic, topic, "g", "g", "$"); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.rdb.Exists(ctx, runs).Result(); n != 0 {
		t.Fatal("the group was created with the run counts of the one before")
	}
	id, err := c.rdb.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []any{"data", "x"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "a", Streams: []string{topic, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	claim := func(consumer string) {
		t.Helper()
		if err := c.rdb.XClaim(ctx, &redis.XClaimArgs{Stream: topic, Group: "g", Consumer: consumer, Messages: []string{id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	l := &lane{id: unorderedLane, stream: topic}
	s := &sub{c: c, topic: topic, group: "g", lanes: map[string]*lane{}, held: map[string]struct{}{}}
	d := &driver.Delivery{Lane: l.id, Position: id, Token: l}
	count := func(want int, record string) {
		t.Helper()
		n, err := s.CountRun(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := c.rdb.HGet(ctx, runs, id).Result()
		if n != want || got != record {
			t.Fatalf("CountRun: %d, record %q; want %d, %q", n, got, want, record)
		}
	}
	claim("b") // delivery 2
	d.Attempt = 2
	count(2, "2:2")
	count(2, "2:2") // the same delivery again
	claim("c")
	d.Attempt = 3
	count(3, "3:3")
	// A record of a later delivery, and one that is no record.
	for _, stale := range []string{"5:9", "x"} {
		if err := c.rdb.HSet(ctx, runs, id, stale).Err(); err != nil {
			t.Fatal(err)
		}
		count(2, "2:3")
	}
	if err := s.Ack(ctx, []*driver.Delivery{d}); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.rdb.HExists(ctx, runs, id).Result(); n {
		t.Fatal("the record outlived the acknowledgement")
	}
	// Acknowledged by another holder meanwhile: counted without a record.
	count(2, "")
}

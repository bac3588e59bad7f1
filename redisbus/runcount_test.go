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

// TestAckAgainAfterFailure fails an acknowledgement (its context ended
// before the XACKs went) and checks that the next one, with a delivery
// of its own, acknowledges both: nothing stays pending, every run count
// of them is deleted, and the member holds none of them.
func TestAckAgainAfterFailure(t *testing.T) {
	ctx := context.Background()
	c, topic := openTestConn(t, "", "redisbus-reack-")
	runs := runsKey(topic, "g")
	if err := c.join(ctx, topic, topic, "g", "g", "$"); err != nil {
		t.Fatal(err)
	}
	l := &lane{id: unorderedLane, stream: topic}
	s := &sub{c: c, topic: topic, group: "g", lanes: map[string]*lane{l.id: l}, held: map[string]struct{}{}}
	var ds []*driver.Delivery
	for i := range 4 {
		id, err := c.rdb.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: []any{"data", "x"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		d := &driver.Delivery{Lane: l.id, Position: id, Attempt: 1 + i%2, Token: l}
		if d.Attempt > 1 { // counted: CountRun left a record
			if err := c.rdb.HSet(ctx, runs, id, "1:2").Err(); err != nil {
				t.Fatal(err)
			}
		}
		ds = append(ds, d)
	}
	if err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "a", Streams: []string{topic, ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	s.hold(ds)
	pending := func() int64 {
		t.Helper()
		p, err := c.rdb.XPending(ctx, topic, "g").Result()
		if err != nil {
			t.Fatal(err)
		}
		return p.Count
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Ack(ended, ds[:3]); err == nil {
		t.Fatal("Ack with an ended context: no error")
	}
	if n := pending(); n != 4 {
		t.Fatalf("%d pending after a failed Ack, want 4", n)
	}
	if len(s.held) != 4 {
		t.Fatalf("the member holds %d after a failed Ack, want 4 (the keeper keeps them its own)", len(s.held))
	}
	if err := s.Ack(ctx, ds[3:]); err != nil {
		t.Fatal(err)
	}
	if n := pending(); n != 0 {
		t.Fatalf("%d pending after the next Ack, want 0", n)
	}
	if n, _ := c.rdb.HLen(ctx, runs).Result(); n != 0 {
		t.Fatalf("%d run counts left after the acknowledgements", n)
	}
	if len(s.held) != 0 || len(l.reack) != 0 {
		t.Fatalf("held %d, to acknowledge again %d; want none", len(s.held), len(l.reack))
	}
}

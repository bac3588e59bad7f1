package redisbus_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestTrim publishes with maxlen and max_age: entries a group has not
// read, or read and not acknowledged, stay whatever maxlen says, until
// trim_unread; what every group is done with goes.
func TestTrim(t *testing.T) {
	u := serverURL(t)
	ctx := context.Background()
	topic := topicName(t, u)
	rdb := raw(t, u)
	publish := func(c *omnibus.Client, n int) {
		t.Helper()
		time.Sleep(1100 * time.Millisecond) // a client trims a stream at most once a second
		ms := make([]*omnibus.Message, n)
		for i := range ms {
			ms[i] = &omnibus.Message{Body: []byte(strconv.Itoa(i))}
		}
		if err := c.Publish(ctx, topic, ms...); err != nil {
			t.Fatal(err)
		}
	}
	length := func() int64 {
		t.Helper()
		n, err := rdb.XLen(ctx, topic).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	read := func(n int64, ack bool) {
		t.Helper()
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{topic, ">"}, Count: n}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ack {
			var ids []string
			for _, m := range res[0].Messages {
				ids = append(ids, m.ID)
			}
			if err := rdb.XAck(ctx, topic, "g", ids...).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := rdb.XGroupCreateMkStream(ctx, topic, "g", "$").Err(); err != nil {
		t.Fatal(err)
	}
	c := transporttest.Open(t, with(u, "maxlen=10"))
	publish(c, 500)
	if n := length(); n != 500 {
		t.Fatalf("after 500 unread: %d entries, want all 500 kept for the group", n)
	}
	read(300, true)
	read(50, false) // pending: still needed
	publish(c, 1)
	// Entries 301-350 are pending, 351-501 unread; the trim keeps them all.
	if n := length(); n != 201 {
		t.Fatalf("after 300 acknowledged and 50 pending: %d entries, want 201", n)
	}
	if p, err := rdb.XPending(ctx, topic, "g").Result(); err != nil || p.Count != 50 {
		t.Fatalf("pending %+v (%v), want the 50 entries intact", p, err)
	}
	unread := transporttest.Open(t, with(u, "maxlen=10&trim_unread=true"))
	publish(unread, 1)
	if n := length(); n != 10 {
		t.Fatalf("with trim_unread: %d entries, want 10", n)
	}
	aged := transporttest.Open(t, with(u, "max_age=500ms&trim_unread=true"))
	publish(aged, 1) // after the pause, only this one is younger than 500ms
	if n := length(); n != 1 {
		t.Fatalf("with max_age 500ms: %d entries, want 1", n)
	}
}

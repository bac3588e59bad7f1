package redisbus

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/testenv"
)

// TestReclaimAfterLoss loses a lane the way a fenced read or acknowledgement
// or a refresh that found the lease expired does (marked lost, the watchdog
// not yet having told the engine) and has the balancer claim the lane again
// before the watchdog runs: the new claim must wait until the old one is
// reported lost, so that the engine hears Claimed, Lost, Claimed, and the
// member holds the new claim's lane, not an unreported old one.
func TestReclaimAfterLoss(t *testing.T) {
	ctx := context.Background()
	c, topic := openTestConn(t, "partitions=1&lease_ttl=30s", "redisbus-reclaim-")
	lanes := &lanesLog{}
	// The member's lease machinery, its goroutines not started: the test
	// plays the balancer and the watchdog in the order of the race.
	s := newSub(c, topic, 1, driver.SubscribeOptions{Group: "g", Lanes: lanes})
	defer s.cancel()
	defer s.rd.Close()
	p := newPartitioned(s)
	s.part = p
	p.claim(0)
	s.mu.Lock()
	old := s.lanes["0"]
	s.mu.Unlock()
	if old == nil || !lanes.has(&lanes.claimed, "0") {
		t.Fatal("lane 0 was not claimed")
	}
	// The lease runs out on the server; the member finds it lost.
	if err := c.rdb.Del(ctx, old.lease).Err(); err != nil {
		t.Fatal(err)
	}
	p.fenced(old)
	// The balancer, woken by the loss, sees the lease free and claims it
	// before the watchdog has reported the old claim lost.
	p.claim(0)
	p.expire(time.Now())
	p.claim(0)
	lanes.mu.Lock()
	claimed, lost := slices.Clone(lanes.claimed), slices.Clone(lanes.lost)
	lanes.mu.Unlock()
	if !slices.Equal(claimed, []string{"0", "0"}) || !slices.Equal(lost, []string{"0"}) {
		t.Fatalf("Claimed %v, Lost %v: want lane 0 claimed, lost and claimed again", claimed, lost)
	}
	s.mu.Lock()
	cur := s.lanes["0"]
	s.mu.Unlock()
	if cur == nil || cur == old || cur.lost || cur.token == old.token {
		t.Fatalf("the member's lane 0 is %+v, want the new claim's (the old token %s)", cur, old.token)
	}
}

// slowLost records the Lanes calls in order, a Lost only when it returns,
// and holds each Lost until release is closed (as the engine's Lost waits
// for a Receive in progress).
type slowLost struct {
	mu      sync.Mutex
	events  []string
	entered chan struct{}
	release chan struct{}
}

func (l *slowLost) add(e string) { l.mu.Lock(); l.events = append(l.events, e); l.mu.Unlock() }
func (l *slowLost) Claimed(ls []string) {
	for _, id := range ls {
		l.add("claimed " + id)
	}
}
func (l *slowLost) Revoked(_ context.Context, ls []string) {}
func (l *slowLost) Lost(ls []string) {
	l.entered <- struct{}{}
	<-l.release
	for _, id := range ls {
		l.add("lost " + id)
	}
}

// TestReclaimWhileLostReported has the balancer look for lanes to claim
// while the watchdog's Lanes.Lost of a lane is still under way: the lane
// is claimed again only after that Lost returned. Told Claimed before
// the Lost, the engine would keep its old lane for the new claim and then
// drop it, with what the new claim delivered into it: a read left pending
// for the member, never handled while it holds the lane, and handled after
// newer entries of its keys by the lane's next owner.
func TestReclaimWhileLostReported(t *testing.T) {
	ctx := context.Background()
	c, topic := openTestConn(t, "partitions=1&lease_ttl=30s", "redisbus-reclaim-")
	lanes := &slowLost{entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := newSub(c, topic, 1, driver.SubscribeOptions{Group: "g", Lanes: lanes})
	defer s.cancel()
	defer s.rd.Close()
	p := newPartitioned(s)
	s.part = p
	p.claim(0)
	s.mu.Lock()
	old := s.lanes["0"]
	s.mu.Unlock()
	if old == nil {
		t.Fatal("lane 0 was not claimed")
	}
	if err := c.rdb.Del(ctx, old.lease).Err(); err != nil {
		t.Fatal(err)
	}
	p.fenced(old)
	expired := make(chan struct{})
	go func() { defer close(expired); p.expire(time.Now()) }()
	<-lanes.entered
	p.claim(0) // the balancer, while the engine is being told
	close(lanes.release)
	<-expired
	p.claim(0)
	lanes.mu.Lock()
	events := slices.Clone(lanes.events)
	lanes.mu.Unlock()
	if want := []string{"claimed 0", "lost 0", "claimed 0"}; !slices.Equal(events, want) {
		t.Fatalf("Lanes calls %q, want %q", events, want)
	}
	s.mu.Lock()
	cur := s.lanes["0"]
	s.mu.Unlock()
	if cur == nil || cur == old || cur.lost {
		t.Fatalf("the member's lane 0 is %+v, want the new claim's", cur)
	}
}

// TestTakeoverPastTrimmed has a lane's takeover meet a claim that comes
// back empty before the scan's end (the pending entries it looked at were
// trimmed): the takeover goes on to the pending entries after them before
// any new entry of the lane is read.
func TestTakeoverPastTrimmed(t *testing.T) {
	ctx := context.Background()
	c, topic := openTestConn(t, "partitions=1&lease_ttl=30s", "redisbus-takeover-")
	stream := streamKey(topic, 0)
	if err := c.rdb.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	var msgs []*driver.Message
	for i := range 13 {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("m%d", i), Body: []byte("x")})
	}
	if err := c.Publish(ctx, topic, msgs, driver.PublishOptions{}); err != nil {
		t.Fatal(err)
	}
	// A previous owner read the first 12 (pending for it); the first 10
	// of those were trimmed since.
	res, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "previous", Streams: []string{stream, ">"}, Count: 12}).Result()
	if err != nil || len(res) != 1 || len(res[0].Messages) != 12 {
		t.Fatalf("the previous owner's read: %v, %v", res, err)
	}
	for _, m := range res[0].Messages[:10] {
		if err := c.rdb.XDel(ctx, stream, m.ID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := newSub(c, topic, 1, driver.SubscribeOptions{Group: "g", Lanes: &lanesLog{}})
	defer s.cancel()
	defer s.rd.Close()
	p := newPartitioned(s)
	s.part = p
	p.claim(0)
	if s.lane("0") == nil {
		t.Fatal("lane 0 was not claimed")
	}
	// Reads of one entry: a claim scans at most 10 pending entries.
	var got []string
	for range 3 {
		ds, err := s.readPartitions(1)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			got = append(got, d.ID)
		}
	}
	if want := []string{"m10", "m11", "m12"}; !slices.Equal(got, want) {
		t.Fatalf("read %v, want %v: the taken-over entries first, in order", got, want)
	}
}

// openTestConn opens a connection of redisbus's own to the test server
// with the URL parameters params, and a topic named from prefix whose
// keys are deleted when t ends.
func openTestConn(t *testing.T, params, prefix string) (*conn, string) {
	t.Helper()
	addr := testenv.Getenv("OMNIBUS_REDIS_ADDR", "127.0.0.1:6379")
	testenv.Require(t, "Redis", addr, "redis-server --daemonize yes")
	u, _ := url.Parse("redis://" + addr + "?" + params)
	cfg, err := parseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := open(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	topic := fmt.Sprintf("%s%x", prefix, rand.Uint32())
	t.Cleanup(func() {
		keys, _ := c.rdb.Keys(ctx, topic+"*").Result()
		if len(keys) > 0 {
			c.rdb.Del(ctx, keys...)
		}
		_ = c.Close()
	})
	return c, topic
}

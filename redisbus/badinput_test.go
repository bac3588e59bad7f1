package redisbus_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/transporttest"
)

func nop(context.Context, *omnibus.Message) error { return nil }

// TestWrongPassword opens a server that requires a password with a wrong
// one and with none: a clear error wrapping ErrInvalid, never showing
// the password; the right one works.
func TestWrongPassword(t *testing.T) {
	srv := startPrivateServer(t, "--requirepass", "right-secret")
	ctx := context.Background()
	for _, u := range []string{
		"redis://:wrong-secret@" + srv.addr(),
		"redis://default:wrong-secret@" + srv.addr(),
		"redis://" + srv.addr(),
	} {
		_, err := omnibus.Open(ctx, u)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", omnibus.RedactURL(u))
		}
		if !errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("Open(%q): %v, want ErrInvalid", omnibus.RedactURL(u), err)
		}
		if strings.Contains(err.Error(), "wrong-secret") || strings.Contains(err.Error(), "right-secret") {
			t.Errorf("error shows the password: %v", err)
		}
		if !strings.Contains(err.Error(), srv.addr()) {
			t.Errorf("error %q does not name the server", err)
		}
		t.Logf("%v", err)
	}
	u := "redis://:right-secret@" + srv.addr()
	c := transporttest.Open(t, u)
	got := make(chan string, 1)
	k, err := c.Subscribe(ctx, "auth", func(ctx context.Context, m *omnibus.Message) error {
		got <- string(m.Body)
		return nil
	}, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	if err := c.Publish(ctx, "auth", &omnibus.Message{Body: []byte("in")}); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if b != "in" {
			t.Fatalf("got %q", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no message with the right password")
	}
}

// TestUnreachable opens a port nothing listens on: an error within the
// deadline, naming the server and not the password.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err = omnibus.Open(ctx, "redis://:secret@"+addr+"?dial_timeout=2s")
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("Open took %v, want it within the 3s deadline", d)
	}
	if strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), addr) {
		t.Errorf("error %q: want the server named and no password", err)
	}
}

// TestWrongType publishes and subscribes to topics whose keys hold
// another type than a stream: ErrInvalid that says so, and the other
// messages of a batch land.
func TestWrongType(t *testing.T) {
	u := serverURL(t)
	ctx := context.Background()
	rdb := raw(t, u)
	t.Run("Unpartitioned", func(t *testing.T) {
		topic := topicName(t, u)
		if err := rdb.Set(ctx, topic, "a string", 0).Err(); err != nil {
			t.Fatal(err)
		}
		c := transporttest.Open(t, u)
		err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")})
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), "another type") {
			t.Errorf("Publish: got %v, want ErrInvalid saying the key holds another type", err)
		}
		_, err = c.Subscribe(ctx, topic, nop, omnibus.Group("g"))
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), topic) {
			t.Errorf("Subscribe: got %v, want ErrInvalid naming the stream", err)
		}
		if v, _ := rdb.Get(ctx, topic).Result(); v != "a string" {
			t.Errorf("the key was changed: %q", v)
		}
	})
	t.Run("Partition", func(t *testing.T) {
		pu := with(u, "partitions=2")
		topic := topicName(t, pu)
		c := transporttest.Open(t, pu)
		if err := c.CreateTopic(ctx, topic, 2); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Set(ctx, topic+":0", "a string", 0).Err(); err != nil {
			t.Fatal(err)
		}
		// A key of each partition.
		keys := map[int]string{}
		for i := 0; len(keys) < 2; i++ {
			k := "k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
			keys[driver.Partition(k, 2)] = k
		}
		err := c.Publish(ctx, topic, &omnibus.Message{Key: keys[1]}, &omnibus.Message{Key: keys[0]}, &omnibus.Message{Key: keys[1]})
		var pe *omnibus.PublishError
		if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(err, omnibus.ErrInvalid) {
			t.Fatalf("Publish: got %v, want index 1 alone failing with ErrInvalid", err)
		}
		if n, _ := rdb.XLen(ctx, topic+":1").Result(); n != 2 {
			t.Errorf("partition 1 holds %d entries, want the 2 others", n)
		}
		_, err = transporttest.Open(t, u).Subscribe(ctx, topic, nop, omnibus.Group("g"))
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "partitions=2") {
			t.Errorf("Subscribe without partitions to a partitioned topic: got %v, want ErrInvalid naming partitions=2", err)
		}
	})
}

// TestTooLarge runs a server whose proto-max-bulk-len is 1 MiB: the
// client learns the limit at Open, refuses a larger message before
// sending it, and publishes the rest of the batch. Sent raw, such a
// message is refused by the server, which closes the connection.
func TestTooLarge(t *testing.T) {
	srv := startPrivateServer(t, "--proto-max-bulk-len", "1mb")
	ctx := context.Background()
	c := transporttest.Open(t, srv.url())
	if got := c.Capabilities().MaxMessageBytes; got != 1<<20 {
		t.Fatalf("MaxMessageBytes %d, want the server's 1 MiB", got)
	}
	big := make([]byte, 1<<20+1)
	err := c.Publish(ctx, "big", &omnibus.Message{Body: []byte("a")}, &omnibus.Message{Body: big}, &omnibus.Message{Body: []byte("b")})
	var pe *omnibus.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(err, omnibus.ErrTooLarge) {
		t.Fatalf("Publish: got %v, want index 1 alone failing with ErrTooLarge", err)
	}
	rdb := raw(t, srv.url())
	if n, _ := rdb.XLen(ctx, "big").Result(); n != 2 {
		t.Errorf("the stream holds %d entries, want the 2 others", n)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "big", Values: []any{"data", big}}).Err(); err == nil {
		t.Errorf("the server took a body over its proto-max-bulk-len: the limit tested is not the server's")
	} else {
		t.Logf("raw XADD of %d bytes: %v", len(big), err)
	}
}

// TestBadURL covers parameters that do not exist or do not parse, and
// headers the wire cannot carry.
func TestBadURL(t *testing.T) {
	ctx := context.Background()
	_, err := omnibus.Open(ctx, "redis://127.0.0.1:6379?partitons=4")
	if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "partitons") || !strings.Contains(err.Error(), "redisbus: URL") {
		t.Fatalf("got %v, want ErrInvalid from redisbus naming partitons", err)
	}
	for _, raw := range []string{
		"redis://127.0.0.1:6379?lease_ttl=100ms",
		"redis://127.0.0.1:6379?claim_idle=1ms",
		"redis://127.0.0.1:6379?partitions=-1",
		"redis://127.0.0.1:6379?maxlen=-5",
		"redis://127.0.0.1:6379?max_age=soon",
		"redis://127.0.0.1:6379?trim_unread=maybe",
		"redis://127.0.0.1:6379/1?db=2",
		"redis://127.0.0.1:6379/x",
		"redis://a:6379,b:6379",
		"redis://:secret@",
		"redis:127.0.0.1",
		"redis://127.0.0.1:6379?tls_ca=/does/not/exist",
	} {
		_, err := omnibus.Open(ctx, raw)
		if !errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("Open(%q): got %v, want ErrInvalid", raw, err)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): the error shows the password: %v", raw, err)
		}
	}
	u := serverURL(t)
	c := transporttest.Open(t, u)
	topic := topicName(t, u)
	for _, h := range []string{"data", "content-type", "ce_id", "CE_Tenant"} {
		err := c.Publish(ctx, topic, &omnibus.Message{Headers: map[string]string{h: "v"}})
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), h) {
			t.Errorf("header %q: got %v, want ErrInvalid naming it", h, err)
		}
	}
}

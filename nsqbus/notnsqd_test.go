package nsqbus_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// notNSQD are servers that do not speak NSQ: Redis, whose answer to
// NSQ's first bytes starts "-ERR" (read as a frame of 759 MB), and a
// listener that answers anything with a frame size of 2 GB and then
// nothing.
func notNSQD(t *testing.T, accepts *atomic.Int32) map[string]string {
	t.Helper()
	const redis = "127.0.0.1:6379"
	c, err := net.DialTimeout("tcp", redis, time.Second)
	if err != nil {
		t.Fatalf("Redis: %v", err)
	}
	_ = c.Close()
	return map[string]string{"redis": redis, "huge": hugeFrames(t, accepts)}
}

// hugeFrames listens on loopback and answers each connection with a
// frame size of 2 GB, then holds it open without a word until the test
// ends; accepts, when not nil, counts the connections.
func hugeFrames(t *testing.T, accepts *atomic.Int32) string {
	return listen(t, accepts, []byte{0x7f, 0xff, 0xff, 0xff})
}

// listen listens on loopback and answers each connection with answer,
// then holds it open without a word until the test ends; accepts, when
// not nil, counts the connections.
func listen(t *testing.T, accepts *atomic.Int32, answer []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() { // ends when the listener closes
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if accepts != nil {
				accepts.Add(1)
			}
			wg.Add(1)
			go func() { // ends with the test
				defer wg.Done()
				defer c.Close()
				if len(answer) > 0 {
					_, _ = c.Write(answer)
				}
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		close(done)
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// bounded runs fn and fails t when it takes more than 2 s or allocates
// more than 50 MB.
func bounded(t *testing.T, what string, fn func()) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	fn()
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%s: %v, %d MB allocated", what, took.Round(time.Millisecond), alloc>>20)
	if took > 2*time.Second {
		t.Errorf("%s took %v", what, took)
	}
	if alloc > 50<<20 {
		t.Errorf("%s allocated %d MB", what, alloc>>20)
	}
}

// TestNotNSQD points nsqbus at servers that speak another protocol:
// Open fails within 2 s with an error wrapping ErrInvalid that names the
// address and not the secret, without allocating what their first bytes
// read as a frame size; Publish to a list of nsqds with one such server
// lands on the real one; Subscribe with one fails as Open does.
func TestNotNSQD(t *testing.T) {
	n, _ := cluster(t)
	var accepts atomic.Int32
	for name, addr := range notNSQD(t, &accepts) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			bounded(t, "Open", func() {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				c, err := omnibus.Open(ctx, "nsq://s3cret@"+addr+"?dial_timeout=2s")
				if err == nil {
					_ = c.Close()
					t.Fatal("Open succeeded")
				}
				t.Log(err)
				if !errors.Is(err, omnibus.ErrInvalid) {
					t.Errorf("Open: %v, want an error wrapping ErrInvalid", err)
				}
				if !strings.Contains(err.Error(), addr) || strings.Contains(err.Error(), "s3cret") {
					t.Errorf("Open: %q, want the address and not the secret", err)
				}
			})
			// nsqlookupd's HTTP API: the answer's size is bounded, and a
			// server that says nothing is waited for as long as ctx lets.
			bounded(t, "Open in lookup mode", func() {
				ctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
				defer cancel()
				c, err := omnibus.Open(ctx, "nsq://"+addr+"?lookup=true&dial_timeout=2s")
				if err == nil {
					_ = c.Close()
					t.Fatal("Open succeeded")
				}
				t.Log(err)
			})

			// Both nsqds' HTTP API is the real one's, so that the
			// channel is created on "both" and Subscribe connects.
			_, httpPort, _ := net.SplitHostPort(n.HTTPAddr())
			u := fmt.Sprintf("nsq://s3cret@%s,%s?http_port=%s&dial_timeout=2s", n.TCPAddr(), addr, httpPort)
			c := transporttest.Open(t, u)
			topic := fmt.Sprintf("notnsqd-%x", rand.Uint32())
			t.Cleanup(func() { deleteTopic(t, topic) })
			tried := accepts.Load()
			for i := range 4 { // round robin: every other one tries the wrong server first
				bounded(t, fmt.Sprintf("Publish %d", i), func() {
					ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					defer cancel()
					if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); err != nil {
						t.Errorf("Publish %d: %v", i, err)
					}
				})
			}
			if name == "huge" && accepts.Load()-tried < 2 {
				t.Errorf("4 publishes connected to the wrong server %d times, want 2 or more", accepts.Load()-tried)
			}
			bounded(t, "Subscribe", func() {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("g"))
				if err == nil {
					_ = k.Close()
					t.Fatal("Subscribe succeeded")
				}
				t.Log(err)
				if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), addr) || strings.Contains(err.Error(), "s3cret") {
					t.Errorf("Subscribe: %q, want an error wrapping ErrInvalid with the address and not the secret", err)
				}
			})
		})
	}
}

// TestSilentServer: a server that takes the connection and says nothing
// fails Open within the dial timeout (go-nsq alone waits for its read
// timeout, a minute).
func TestSilentServer(t *testing.T) {
	addr := listen(t, nil, nil)
	bounded(t, "Open", func() {
		c, err := omnibus.Open(context.Background(), "nsq://"+addr+"?dial_timeout=1s")
		if err == nil {
			_ = c.Close()
			t.Fatal("Open succeeded")
		}
		t.Log(err)
		if !strings.Contains(err.Error(), addr) || errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("Open: %v, want the address, and no ErrInvalid (the server may be nsqd, slow)", err)
		}
	})
}

package redisbus_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestDurabilityAll publishes to a primary with one replica (both
// redis-server processes of the test's own): durability all waits until
// the replica has the batch, and fails, saying so, when the replica does
// not answer within wait_timeout (it is stopped with SIGSTOP); leader
// does not wait for it.
func TestDurabilityAll(t *testing.T) {
	primary := startPrivateServer(t)
	replica := startPrivateServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.port))
	rdb := raw(t, primary.url())
	ctx := context.Background()
	waitFor(t, 20*time.Second, func() bool {
		info, err := rdb.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, "the replica did not connect")

	all := transporttest.Open(t, with(primary.url(), "wait_timeout=500ms"))
	if err := all.Publish(ctx, "durable", &omnibus.Message{Body: []byte("1")}); err != nil {
		t.Fatalf("Publish at durability all with the replica up: %v", err)
	}
	rep := raw(t, replica.url())
	if n, err := rep.XLen(ctx, "durable").Result(); err != nil || n != 1 {
		t.Fatalf("the replica holds %d entries (%v) when Publish returned, want 1", n, err)
	}

	replica.signal(t, syscall.SIGSTOP)
	defer replica.signal(t, syscall.SIGCONT)
	start := time.Now()
	err := all.Publish(ctx, "durable", &omnibus.Message{Body: []byte("2")})
	if err == nil || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Fatalf("Publish at durability all with the replica stopped: got %v, want an error saying 0 of 1 replicas", err)
	}
	if errors.Is(err, omnibus.ErrRetryable) {
		t.Errorf("the error is retryable, but the entry is on the primary: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Publish took %v, want about the 500ms wait_timeout", d)
	}
	t.Logf("%v (after %v)", err, time.Since(start).Round(time.Millisecond))
	leader := transporttest.Open(t, with(primary.url(), "durability=leader"))
	start = time.Now()
	if err := leader.Publish(ctx, "durable", &omnibus.Message{Body: []byte("3")}); err != nil {
		t.Fatalf("Publish at durability leader with the replica stopped: %v", err)
	}
	if d := time.Since(start); d > 400*time.Millisecond {
		t.Errorf("Publish at leader took %v: it waited for the replica", d)
	}
}

// signal sends sig to the server process.
func (s *privateServer) signal(t testing.TB, sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		if err := s.cmd.Process.Signal(sig); err != nil {
			t.Errorf("signal %v: %v", sig, err)
		}
	}
}

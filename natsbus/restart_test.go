package natsbus_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

const natsServerBin = "/usr/sbin/nats-server"

// privateServer is a nats-server process of the test's own, on a random
// port with its own store, so restarting it disturbs nobody.
type privateServer struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
}

func startPrivateServer(t testing.TB) *privateServer {
	t.Helper()
	if _, err := os.Stat(natsServerBin); err != nil {
		testenv.SkipOrFail(t, "missing binary", natsServerBin+" not found; install nats-server")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &privateServer{t: t, port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *privateServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

func (s *privateServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(natsServerBin, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir,
		"-l", filepath.Join(s.dir, "server.log"))
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start nats-server: %v", err)
	}
	eventually(s.t, 10*time.Second, func() error {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.url(), "nats://"), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

func (s *privateServer) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// TestRestart publishes 20,000 unique IDs while the server restarts
// twice, and checks that the consumer group receives every one.
func TestRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): restart test")
	}
	srv := startPrivateServer(t)
	u := srv.url() + "?ack_wait=3s&reconnect_wait=100ms"
	pub := transporttest.Open(t, u)
	sub := transporttest.Open(t, u)
	topic := "restart"
	ctx := context.Background()
	col := newCollector()
	k, err := sub.Subscribe(ctx, topic, col.handle, omnibus.Group("restart"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)

	const total = 20000
	ids := make([]string, 0, total)
	var published atomic.Int64
	restarted := make(chan struct{})
	go func() {
		// One restart while publishing, one while only consuming.
		defer close(restarted)
		for i, at := range []int{total / 3, total * 4 / 5} {
			for (i == 0 && published.Load() < int64(at)) || (i == 1 && col.unique() < at) {
				time.Sleep(time.Millisecond)
			}
			srv.stop()
			time.Sleep(300 * time.Millisecond)
			srv.start()
		}
	}()
	body := []byte(strings.Repeat("x", 100))
	retries := 0
	for i := 0; i < total; {
		var ms []*omnibus.Message
		for j := 0; j < 100; j++ {
			ms = append(ms, &omnibus.Message{ID: fmt.Sprintf("m-%05d", i+j), Body: body})
		}
		// A publish that fails during the restart is retried with the
		// same IDs: the duplicate window drops what landed.
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pub.Publish(pctx, topic, ms...)
		cancel()
		if err != nil {
			retries++
			var pe *omnibus.PublishError
			if !errors.As(err, &pe) && !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("publish (retrying): %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		i += len(ms)
		published.Store(int64(i))
	}
	<-restarted
	col.waitFor(t, total, 90*time.Second)
	col.mu.Lock()
	defer col.mu.Unlock()
	var missing []string
	for _, id := range ids {
		if col.seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d lost, first %v", len(missing), total, missing[:min(5, len(missing))])
	}
	dups := 0
	for _, n := range col.seen {
		dups += n - 1
	}
	t.Logf("%d unique IDs received across 2 restarts, %d redeliveries, %d publish calls retried", len(col.seen), dups, retries)
}

// TestBadInput covers the errors a user meets first.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	t.Run("Unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close() // nothing listens there now
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err = omnibus.Open(cctx, "nats://user:secret@"+addr+"?connect_timeout=2s")
		if err == nil {
			t.Fatal("Open of an unreachable server succeeded")
		}
		if d := time.Since(start); d > 4*time.Second {
			t.Errorf("Open took %v, want it within the 3s deadline", d)
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("error shows the password: %v", err)
		}
		if !strings.Contains(err.Error(), addr) {
			t.Errorf("error %q does not name the server %s", err, addr)
		}
	})
	t.Run("UnwritableDir", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(file, "data") // under a regular file: cannot exist
		_, err := omnibus.Open(ctx, natsbus.EmbeddedURL(dir))
		if err == nil || !strings.Contains(err.Error(), "data directory") || !strings.Contains(err.Error(), dir) {
			t.Fatalf("Open with data directory %s: got %v, want an error naming the directory", dir, err)
		}
	})
	t.Run("IllegalSubject", func(t *testing.T) {
		c := transporttest.Open(t, natsbus.EmbeddedURL(t.TempDir()))
		for topic, want := range map[string]string{
			"orders created": `' '`,
			"orders.*":       `'*'`,
			"orders.>":       `'>'`,
			"orders..x":      "empty token",
			"$SYS.x":         `'$'`,
			"tab\there":      `'\t'`,
		} {
			err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")})
			if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Errorf("Publish to %q: got %v, want ErrInvalid naming %s", topic, err, want)
			}
			_, err = c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Order(omnibus.OrderNone))
			if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Errorf("Subscribe to %q: got %v, want ErrInvalid naming %s", topic, err, want)
			}
		}
	})
	t.Run("UnknownParameter", func(t *testing.T) {
		_, err := omnibus.Open(ctx, "nats://embedded?partitons=4")
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), "partitons") {
			t.Fatalf("got %v, want ErrInvalid naming partitons", err)
		}
		if !strings.Contains(err.Error(), "natsbus: URL") {
			t.Errorf("error %q does not start with the transport's name", err)
		}
		for _, raw := range []string{"nats://embedded?lease_ttl=100ms", "nats://embedded?rebalance_interval=0s", "nats://embedded?partitions=-1"} {
			if _, err := omnibus.Open(ctx, raw); !errors.Is(err, omnibus.ErrInvalid) {
				t.Errorf("Open(%q): got %v, want ErrInvalid", raw, err)
			}
		}
		_, err = omnibus.Open(ctx, "nats://127.0.0.1:4222?dir=/tmp/x")
		if !errors.Is(err, omnibus.ErrInvalid) {
			t.Fatalf("dir on an external server: got %v, want ErrInvalid", err)
		}
	})
}

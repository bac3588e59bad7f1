package redisbus_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/redisbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestMain silences the engine's logs (injected handler failures log a
// stack each) unless REDISBUS_LOG is set, and runs the crash test's
// child member when asked to (see crash_test.go).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if os.Getenv("REDISBUS_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	os.Exit(m.Run())
}

// serverURL is the shared Redis server of the tests
// (OMNIBUS_REDIS_URL, default redis://127.0.0.1:6379).
func serverURL(t testing.TB) string {
	t.Helper()
	u := testenv.Getenv("OMNIBUS_REDIS_URL", "redis://127.0.0.1:6379")
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatalf("OMNIBUS_REDIS_URL %q: %v", u, err)
	}
	testenv.Require(t, "Redis", pu.Host, "redis-server --daemonize yes")
	return u
}

// with appends params to a URL without a query.
func with(u string, params ...string) string {
	if len(params) == 0 {
		return u
	}
	return u + "?" + strings.Join(params, "&")
}

// raw returns a go-redis client on the server of rawURL.
func raw(t testing.TB, rawURL string) *redis.Client {
	t.Helper()
	o, err := redisbus.ClientOptions(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// testPrefix starts the topics of this package's own tests in this
// process, so that deleteKeys removes them and nothing of other runs.
var testPrefix = fmt.Sprintf("redisbus-test-%06x-", rand.Uint32()&0xffffff)

// topicName returns a fresh topic for t, whose keys are deleted at its
// end.
func topicName(t testing.TB, rawURL string) string {
	t.Helper()
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	topic := fmt.Sprintf("%s%s-%x", testPrefix, name, rand.Uint32())
	rdb := raw(t, rawURL)
	t.Cleanup(func() { deleteKeys(t, rdb, topic) })
	return topic
}

// deleteKeys deletes every key that starts with prefix.
func deleteKeys(t testing.TB, rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pattern := strings.NewReplacer("*", `\*`, "?", `\?`, "[", `\[`).Replace(prefix) + "*"
	it := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for it.Next(ctx) {
		keys = append(keys, it.Val())
	}
	if err := it.Err(); err != nil {
		t.Logf("scan %q: %v", pattern, err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := rdb.Del(ctx, keys[:n]...).Err(); err != nil {
			t.Logf("delete keys: %v", err)
		}
		keys = keys[n:]
	}
}

// cleanupSuite deletes at the end of t the keys of the topics the
// conformance suite created in this process.
func cleanupSuite(t *testing.T, rawURL string) {
	rdb := raw(t, rawURL)
	t.Cleanup(func() { deleteKeys(t, rdb, transporttest.TopicPrefix()) })
}

// privateServer is a redis-server process of the test's own, on a free
// port with its own directory, so restarting it or setting a password
// disturbs nobody. It keeps its data in an append-only file, so a
// restart keeps what it acknowledged.
type privateServer struct {
	t        testing.TB
	port     int
	dir      string
	args     []string
	password string // --requirepass

	mu  sync.Mutex
	cmd *exec.Cmd
}

func startPrivateServer(t testing.TB, args ...string) *privateServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.SkipOrFail(t, "missing binary", "redis-server is not installed (apt-get install redis-server, or run scripts/test.sh)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &privateServer{t: t, port: port, dir: t.TempDir()}
	for i, a := range args {
		if a == "--requirepass" && i+1 < len(args) {
			s.password = args[i+1]
		}
	}
	s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always",
		"--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no"}, args...)
	s.args = append([]string{bin}, s.args...)
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *privateServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *privateServer) url() string { return "redis://" + s.addr() }

func (s *privateServer) start() {
	s.t.Helper()
	cmd := exec.Command(s.args[0], s.args[1:]...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	// Up when it answers PING: while it loads its data it answers LOADING.
	rdb := redis.NewClient(&redis.Options{Addr: s.addr(), Password: s.password, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := rdb.Ping(context.Background()).Err()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server on %s did not come up: %v\n%s", s.addr(), err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the server with SIGTERM, which writes the append-only file
// out; it is killed if it has not ended within 10 seconds.
func (s *privateServer) stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// restart stops the server and starts it again on its data.
func (s *privateServer) restart(pause time.Duration) {
	s.stop()
	time.Sleep(pause)
	s.start()
}

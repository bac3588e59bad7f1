package bus_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"

	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/internal/testenv"
	_ "github.com/omnibus-go/omnibus/kafkabus"
	_ "github.com/omnibus-go/omnibus/membus"
	_ "github.com/omnibus-go/omnibus/natsbus"
	_ "github.com/omnibus-go/omnibus/nsqbus"
	_ "github.com/omnibus-go/omnibus/rabbitbus"
	_ "github.com/omnibus-go/omnibus/redisbus"
)

// TestMain runs nsqd when the test binary was started as one (see
// nsqtest), silences the engine's logs (the injected handler failures
// log each) unless BUS_LOG is set, and fails when a goroutine outlives
// the tests. The tests' nsqd stops at the end.
func TestMain(m *testing.M) {
	nsqtest.Main()
	if os.Getenv("BUS_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	code := m.Run()
	stopNSQ()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// transport is one transport the bus's tests run on.
type transport struct {
	name string
	// url returns the URL of the transport for test t, and registers the
	// removal of what the test creates under namespace ns on a shared
	// server.
	url func(t testing.TB, ns string) string
}

var (
	rabbitURL  = testenv.Getenv("RABBITBUS_URL", "amqp://guest:guest@127.0.0.1:5672/")
	rabbitAddr = testenv.Getenv("RABBITBUS_ADDR", "127.0.0.1:5672")
	natsURL    = testenv.Getenv("NATS_URL", "nats://127.0.0.1:4222")
	redisAddr  = testenv.Getenv("REDIS_ADDR", "127.0.0.1:6379")
)

const (
	startRabbit = "rabbitmq-server -detached"
	startRedis  = "redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no --daemonize yes"
	startNATS   = "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log"
	// kafkaParams make group membership react in test time.
	kafkaParams = "heartbeat_interval=100ms&session_timeout=10s&rebalance_timeout=20s&fetch_max_wait=100ms&metadata_max_age=1s"
)

// transports are the transports every scenario runs on.
var transports = []transport{
	{name: "membus", url: func(t testing.TB, ns string) string { return "mem://" + ns }},
	{name: "kafka", url: func(t testing.TB, ns string) string {
		c, err := kfake.NewCluster(kfake.NumBrokers(3))
		if err != nil {
			t.Fatalf("kfake: %v", err)
		}
		t.Cleanup(c.Close)
		return "kafka://" + strings.Join(c.ListenAddrs(), ",") + "?" + kafkaParams
	}},
	{name: "rabbitmq", url: func(t testing.TB, ns string) string {
		testenv.Require(t, "RabbitMQ", rabbitAddr, startRabbit)
		t.Cleanup(func() { deleteRabbit(t, ns) })
		return rabbitURL
	}},
	{name: "nats", url: func(t testing.TB, ns string) string {
		u, err := url.Parse(natsURL)
		if err != nil {
			t.Fatalf("NATS_URL %q: %v", natsURL, err)
		}
		testenv.Require(t, "NATS server with JetStream", u.Host, startNATS)
		t.Cleanup(func() { deleteStreams(t, ns) })
		return natsURL
	}},
	{name: "nats-embedded", url: func(t testing.TB, ns string) string {
		return "nats://embedded?dir=" + t.TempDir()
	}},
	{name: "redis", url: func(t testing.TB, ns string) string {
		testenv.Require(t, "Redis", redisAddr, startRedis)
		t.Cleanup(func() { deleteRedis(t, ns) })
		return "redis://" + redisAddr + "?partitions=4&lease_ttl=2s&rebalance_interval=100ms"
	}},
	{name: "nsq", url: func(t testing.TB, ns string) string {
		n := nsqd(t)
		t.Cleanup(func() {
			if err := nsqtest.DeleteTopics(n.HTTPAddr(), ns); err != nil {
				t.Logf("cleanup: %v", err)
			}
		})
		return n.URL("poll_interval=200ms")
	}},
}

// The tests' nsqd, started by the first test that needs it.
var nsqServer struct {
	once sync.Once
	dir  string
	nsqd *nsqtest.NSQD
	err  error
}

func nsqd(t testing.TB) *nsqtest.NSQD {
	t.Helper()
	nsqServer.once.Do(func() {
		if nsqServer.dir, nsqServer.err = os.MkdirTemp("", "omnibus-bus-nsqd-"); nsqServer.err == nil {
			nsqServer.nsqd, nsqServer.err = nsqtest.Start(nsqServer.dir, nsqtest.Config{})
		}
	})
	if nsqServer.err != nil {
		t.Fatalf("nsqd: %v", nsqServer.err)
	}
	return nsqServer.nsqd
}

func stopNSQ() {
	if nsqServer.nsqd != nil {
		nsqServer.nsqd.Close()
	}
	if nsqServer.dir != "" {
		_ = os.RemoveAll(nsqServer.dir)
	}
}

// deleteRedis deletes the keys of namespace ns (all the topics' keys
// start with it) from the Redis server.
func deleteRedis(t testing.TB, ns string) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	it := rdb.Scan(ctx, 0, ns+"*", 1000).Iterator()
	for it.Next(ctx) {
		if err := rdb.Del(ctx, it.Val()).Err(); err != nil {
			t.Logf("cleanup: delete %s: %v", it.Val(), err)
		}
	}
}

// namespace returns a namespace no other run uses.
func namespace() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "bt" + hex.EncodeToString(b[:])
}

// deleteStreams removes the streams (and KV buckets) of namespace ns
// from the external NATS server.
func deleteStreams(t testing.TB, ns string) {
	nc, err := nats.Connect(natsURL, nats.Timeout(2*time.Second))
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var del []string
	for n := range js.StreamNames(ctx).Name() {
		if strings.HasPrefix(n, ns) || strings.HasPrefix(n, "KV_"+ns) {
			del = append(del, n)
		}
	}
	for _, n := range del {
		if err := js.DeleteStream(ctx, n); err != nil {
			t.Logf("cleanup: delete stream %s: %v", n, err)
		}
	}
}

// deleteRabbit removes the exchanges and queues of namespace ns (all
// their names start with it) from the RabbitMQ server.
func deleteRabbit(t testing.TB, ns string) { testenv.DeleteRabbit(t, rabbitURL, ns) }

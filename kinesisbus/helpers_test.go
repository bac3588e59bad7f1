package kinesisbus_test

import (
	"context"
	"flag"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/testenv"
	_ "github.com/omnibus-go/omnibus/kinesisbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// The emulators scripts/test.sh starts: kinesalite and dynalite.
var (
	kinesisAddr = testenv.Getenv("OMNIBUS_KINESIS_ADDR", "127.0.0.1:4567")
	dynamoAddr  = testenv.Getenv("OMNIBUS_DYNAMODB_ADDR", "127.0.0.1:4568")
)

const startServers = "scripts/test.sh (kinesalite and dynalite from npm, on 127.0.0.1:4567 and :4568)"

// testParams make leases move in test time: a lease expires after 3s
// without renewal (long enough for renewals on a machine loaded by -race),
// shards are listed every second, and an empty shard is polled every 200ms
// (Kinesis allows 5 reads per second per shard; kinesalite, one process,
// serves every shard of every test).
const testParams = "failover_time=3s&shard_sync_interval=1s&poll_interval=200ms"

// fakeKeys are the static credentials the emulators accept.
const fakeKeys = "AKIDTEST:secretTEST"

// need skips the test (fails it in CI) when the emulators are not running.
func need(t testing.TB) {
	t.Helper()
	testenv.Require(t, "kinesalite", kinesisAddr, startServers)
	testenv.Require(t, "dynalite", dynamoAddr, startServers)
}

// kinesisURL is the kinesis:// URL of the emulators (or of the proxies at
// kin and ddb) with the test parameters and extra ones ("a=b&c=d").
func kinesisURL(kin, ddb, extra string) string {
	u := "kinesis://" + fakeKeys + "@us-east-1?endpoint=http://" + kin + "&dynamodb_endpoint=http://" + ddb + "&" + testParams
	if extra != "" {
		u += "&" + extra
	}
	return u
}

func testURL(extra string) string { return kinesisURL(kinesisAddr, dynamoAddr, extra) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawClients are SDK clients on the emulators, for what the tests do
// behind omnibus's back.
func rawClients() (*kinesis.Client, *dynamodb.Client) {
	cfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("AKIDTEST", "secretTEST", ""),
	}
	kin := kinesis.NewFromConfig(cfg, func(o *kinesis.Options) { o.BaseEndpoint = aws.String("http://" + kinesisAddr) })
	ddb := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) { o.BaseEndpoint = aws.String("http://" + dynamoAddr) })
	return kin, ddb
}

// TestMain deletes, at the end, the streams and lease tables this
// process's tests created on the shared emulators (their names start
// with the suite's prefix, or with "kinesisbus-test-").
//
// The tests wait on the emulators rather than on the CPU, each on streams
// of its own, and run in parallel: all at once unless -parallel says
// otherwise (go test's default, GOMAXPROCS, would leave the conformance
// suite, the longest, waiting behind the others on a small machine).
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "16")
	}
	code := m.Run()
	cleanup(transporttest.TopicPrefix(), testPrefix)
	os.Exit(code)
}

// testPrefix starts the names of what this package's own tests create.
var testPrefix = "kbt-" + strings.TrimPrefix(transporttest.TopicPrefix(), "omnibus-")

func cleanup(prefixes ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kin, ddb := rawClients()
	ours := func(name string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
	if out, err := kin.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(10000)}); err == nil {
		for _, s := range out.StreamNames {
			if ours(s) {
				_, _ = kin.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(s)})
			}
		}
	}
	var start *string
	for {
		out, err := ddb.ListTables(ctx, &dynamodb.ListTablesInput{ExclusiveStartTableName: start})
		if err != nil {
			return
		}
		for _, name := range out.TableNames {
			if ours(name) {
				_, _ = ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
			}
		}
		if out.LastEvaluatedTableName == nil {
			return
		}
		start = out.LastEvaluatedTableName
	}
}

// proxy forwards TCP connections from a loopback port to target until
// cut: then it closes every connection and refuses new ones, as a
// network partition or a crashed host would look to the server. While
// paused it accepts connections and reads what either side sends but
// forwards nothing, as a network that drops packets (or a server that
// hangs) looks to a client: calls neither fail nor return. While frozen
// it does the same, and the connections of that time stay silent after
// Thaw, as a client sees connections whose path was lost (a NAT or load
// balancer that forgot them, a server replaced): only new connections
// are answered.
type proxy struct {
	relay   testenv.Relay
	mu      sync.Mutex
	changed chan struct{} // closed, and replaced, when paused or frozen ends
	conns   []*testenv.RelayConn
	paused  bool
	frozen  bool
	dead    map[*testenv.RelayConn]bool // connections frozen for good
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	p := &proxy{changed: make(chan struct{}), dead: map[*testenv.RelayConn]bool{}}
	p.relay.Accept = func(c *testenv.RelayConn) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.conns = append(p.conns, c)
		if p.frozen {
			p.dead[c] = true
		}
	}
	p.relay.Chunk = func(c *testenv.RelayConn, _ testenv.Dir, _ []byte) { p.hold(c) }
	p.relay.Start(t, target)
	return p
}

func (p *proxy) Addr() string { return p.relay.Addr() }

// hold holds what c passes, its end included, while the proxy is paused
// or frozen, and for good when c was frozen: a connection frozen for good
// stays silent to the end, its close included (the server's closing an
// idle connection, node's keep-alive timeout of 5s, must not reach a
// client whose path to the server is lost).
func (p *proxy) hold(c *testenv.RelayConn) {
	for {
		p.mu.Lock()
		held, changed := p.paused || p.frozen || p.dead[c], p.changed
		p.mu.Unlock()
		if !held {
			return
		}
		select {
		case <-changed:
		case <-p.relay.Done():
			return
		}
	}
}

// wake wakes what the proxy holds, to look again; p.mu is held.
func (p *proxy) wake() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Pause stops forwarding: calls through the proxy hang until Resume.
func (p *proxy) Pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

// Resume forwards again what was held and what follows.
func (p *proxy) Resume() {
	p.mu.Lock()
	p.paused = false
	p.wake()
	p.mu.Unlock()
}

// Freeze stops forwarding, for good on the connections open now and on
// those opened until Thaw.
func (p *proxy) Freeze() {
	p.mu.Lock()
	p.frozen = true
	for _, c := range p.conns {
		p.dead[c] = true
	}
	p.mu.Unlock()
}

// Thaw forwards on connections opened from now on.
func (p *proxy) Thaw() {
	p.mu.Lock()
	p.frozen = false
	p.wake()
	p.mu.Unlock()
}

// Cut closes the proxy's connections and its port.
func (p *proxy) Cut() { p.relay.Close() }

// publishKeyed publishes on stream, every 50ms until stopped, one
// message of each of keys keys ("k0", "k1", ...), whose bodies count up.
// Stopping it waits for the publisher and returns the IDs it published;
// a failed publish fails t. Calling it again returns nil.
func publishKeyed(t *testing.T, pub *omnibus.Client, stream string, keys int) (stop func() []string) {
	t.Helper()
	var ids []string
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ctx.Err() == nil; n++ {
			ms := make([]*omnibus.Message, keys)
			for i := range ms {
				ms[i] = &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte(strconv.Itoa(n))}
			}
			pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := pub.Publish(pctx, stream, ms...)
			pcancel()
			if err != nil {
				t.Errorf("Publish: %v", err)
				return
			}
			for _, m := range ms {
				ids = append(ids, m.ID)
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return func() (out []string) {
		once.Do(func() {
			cancel()
			<-done
			out = ids
		})
		return out
	}
}

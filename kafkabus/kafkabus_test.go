package kafkabus_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/kafkabus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// ids counts the unique message IDs handled across consumers.
type ids struct {
	mu   sync.Mutex
	seen map[string]int
	all  int
}

func newIDs() *ids { return &ids{seen: map[string]int{}} }

func (c *ids) handler(ctx context.Context, m *omnibus.Message) error {
	c.mu.Lock()
	c.seen[m.ID]++
	c.all++
	c.mu.Unlock()
	return nil
}

func (c *ids) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// TestRebalance runs three members of one group, each in its own client
// as separate processes would, on a 12-partition topic; mid-stream one
// leaves and another joins. Every one of 20,000 unique IDs must be
// handled; duplicates are allowed (at least once) and reported.
func TestRebalance(t *testing.T) {
	cluster := newCluster(t)
	url := clusterURL(cluster, "")
	pub := transporttest.Open(t, url)
	const topic, n, partitions = "rebalance", 20000, 12
	if err := pub.CreateTopic(ctxT(t), topic, partitions); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	seen := newIDs()
	h := func(ctx context.Context, m *omnibus.Message) error {
		if rand.IntN(50) == 0 {
			time.Sleep(time.Millisecond) // some work in flight at each revocation
		}
		return seen.handler(ctx, m)
	}
	member := func(name string) *omnibus.Consumer {
		k, err := transporttest.Open(t, url).Subscribe(ctxT(t), topic, h, omnibus.Group("rebalance"),
			omnibus.StartFrom(omnibus.StartEarliest), omnibus.DrainTimeout(10*time.Second))
		if err != nil {
			t.Fatalf("Subscribe %s: %v", name, err)
		}
		t.Cleanup(func() { _ = k.Close() })
		return k
	}
	a, b, c := member("a"), member("b"), member("c")
	stopA, stopC := transporttest.RunConsumer(t, a), transporttest.RunConsumer(t, c)
	runB := transporttest.RunConsumer(t, b)
	_ = runB

	var want []string
	published := make(chan struct{})
	var perr error
	go func() {
		defer close(published)
		for i := 0; i < n; i += 200 {
			ms := make([]*omnibus.Message, 0, 200)
			for j := i; j < i+200; j++ {
				ms = append(ms, &omnibus.Message{ID: "m" + strconv.Itoa(j), Key: "k" + strconv.Itoa(j%97), Body: []byte("payload")})
			}
			if err := pub.Publish(context.Background(), topic, ms...); err != nil {
				perr = err
				return
			}
			time.Sleep(2 * time.Millisecond) // a stream, not one burst
		}
	}()
	for i := range n {
		want = append(want, "m"+strconv.Itoa(i))
	}

	transporttest.Eventually(t, time.Minute, func() bool { return seen.unique() > n/4 }, func() string { return "no progress" })
	// b leaves the group gracefully: its partitions are drained and
	// committed, then move to a and c.
	if err := b.Shutdown(ctxT(t)); err != nil {
		t.Fatalf("b.Shutdown: %v", err)
	}
	transporttest.Eventually(t, time.Minute, func() bool { return seen.unique() > n/2 }, func() string { return "no progress after b left" })
	// d joins and takes partitions from a and c.
	d := member("d")
	stopD := transporttest.RunConsumer(t, d)
	<-published
	if perr != nil {
		t.Fatalf("Publish: %v", perr)
	}
	transporttest.Eventually(t, time.Minute, func() bool { return seen.unique() == n }, func() string {
		return fmt.Sprintf("handled %d of %d unique IDs", seen.unique(), n)
	})
	stopA()
	stopC()
	stopD()
	seen.mu.Lock()
	defer seen.mu.Unlock()
	for _, id := range want {
		if seen.seen[id] == 0 {
			t.Fatalf("message %s lost", id)
		}
	}
	t.Logf("%d unique IDs handled, %d deliveries (%d redelivered across the rebalances)", len(seen.seen), seen.all, seen.all-len(seen.seen))
}

// TestUnreachableBroker: Open and Publish fail with a clear error within
// their context's deadline, whether the port refuses connections or a
// server accepts and never answers.
func TestUnreachableBroker(t *testing.T) {
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	_ = refused.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for _, tc := range []struct{ name, addr string }{{"refused", refusedAddr}, {"silent", silent.Addr().String()}} {
		t.Run(tc.name, func(t *testing.T) {
			const deadline = time.Second
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			c, err := omnibus.Open(ctx, "kafka://user:s3cret@"+tc.addr)
			took := time.Since(start)
			if err == nil {
				_ = c.Close()
				t.Fatal("Open of an unreachable broker succeeded")
			}
			if took > deadline+2*time.Second {
				t.Errorf("Open returned after %v, want about the context deadline %v", took, deadline)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.addr) || strings.Contains(msg, "s3cret") {
				t.Errorf("error %q: want the broker address and no password", msg)
			}
			t.Logf("Open after %v: %v", took.Round(time.Millisecond), err)
		})
	}

	t.Run("brokers gone after open", func(t *testing.T) {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(1, "gone"))
		if err != nil {
			t.Fatal(err)
		}
		c := transporttest.Open(t, clusterURL(cluster, ""))
		if err := c.Publish(ctxT(t), "gone", &omnibus.Message{Body: []byte("before")}); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		cluster.Close()
		const deadline = time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		err = c.Publish(ctx, "gone", &omnibus.Message{Body: []byte("after")})
		took := time.Since(start)
		if err == nil {
			t.Fatal("Publish to a stopped cluster succeeded")
		}
		if took > deadline+2*time.Second {
			t.Errorf("Publish returned after %v, want about the context deadline %v", took, deadline)
		}
		t.Logf("Publish after %v: %v", took.Round(time.Millisecond), err)
	})
}

// TestTooLarge: a record over max_message_bytes fails alone, with
// ErrTooLarge and the franz-go error reachable, while the rest of its
// batch lands (the driver is called directly, past the portable layer's
// own size check). A message whose Size is the declared MaxMessageBytes,
// with the headers a dead letter carries, lands: the declared limit
// leaves room for the record's overhead.
func TestTooLarge(t *testing.T) {
	cluster := newCluster(t, kfake.SeedTopics(1, "big"))
	c := transporttest.Open(t, clusterURL(cluster, ""))
	limit := c.Capabilities().MaxMessageBytes
	if want := kafkabus.DefaultMaxMessageBytes - 512; limit != want {
		t.Fatalf("MaxMessageBytes %d, want Kafka's default less the record overhead, %d", limit, want)
	}
	full := &omnibus.Message{ID: "full", Key: "k", Type: "t.type", Source: "/s", Headers: map[string]string{
		omnibus.HeaderDeadReason: "r", omnibus.HeaderDeadAttempts: "5", omnibus.HeaderDeadTopic: "big", omnibus.HeaderDeadGroup: "g",
		omnibus.HeaderDeadLane: "0", omnibus.HeaderDeadPosition: "12345", omnibus.HeaderDeadFirstFailure: time.Now().Format(time.RFC3339Nano),
		omnibus.HeaderDeadLastFailure: time.Now().Format(time.RFC3339Nano)}}
	size := len(full.ID) + len(full.Key) + len(full.Type) + len(full.Source) // as driver.Message.Size counts
	for k, v := range full.Headers {
		size += len(k) + len(v)
	}
	full.Body = make([]byte, limit-size)
	if err := c.Publish(ctxT(t), "big", full); err != nil {
		t.Fatalf("a message of exactly MaxMessageBytes: %v", err)
	}
	ms := []*driver.Message{
		{ID: "small-1", Body: []byte("one"), Time: time.Now()},
		{ID: "huge", Body: make([]byte, kafkabus.DefaultMaxMessageBytes), Time: time.Now()},
		{ID: "small-2", Body: []byte("two"), Time: time.Now()},
	}
	err := c.Driver().Publish(ctxT(t), "big", ms, driver.PublishOptions{})
	var be *driver.MessageErrors
	if !errors.As(err, &be) || len(be.Errs) != 3 {
		t.Fatalf("Publish: got %v, want a *driver.MessageErrors with 3 entries", err)
	}
	if be.Errs[0] != nil || be.Errs[2] != nil {
		t.Errorf("small messages failed: %v", be.Errs)
	}
	var ke *kerr.Error
	if !errors.Is(be.Errs[1], driver.ErrTooLarge) || !errors.As(be.Errs[1], &ke) {
		t.Errorf("oversized message: got %v, want ErrTooLarge wrapping a *kerr.Error", be.Errs[1])
	}
	t.Logf("oversized: %v", be.Errs[1])

	// The two small ones landed, and the full one.
	seen := newIDs()
	k, err := c.Subscribe(ctxT(t), "big", seen.handler, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	transporttest.RunConsumer(t, k)
	transporttest.Eventually(t, 30*time.Second, func() bool { return seen.unique() == 3 }, func() string {
		return fmt.Sprintf("received %d of the 2 small messages and the full one", seen.unique())
	})
}

// TestTopics: a topic that does not exist is ErrNotFound for Publish and
// Subscribe unless create_topics asks for it; dead-letter topics are
// created by default; CreateTopic creates and grows.
func TestTopics(t *testing.T) {
	cluster := newCluster(t)
	c := transporttest.Open(t, clusterURL(cluster, ""))
	noop := func(context.Context, *omnibus.Message) error { return nil }

	err := c.Publish(ctxT(t), "nope", &omnibus.Message{Body: []byte("x")})
	if !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("Publish to a missing topic: got %v, want ErrNotFound", err)
	}
	if _, err := c.Subscribe(ctxT(t), "nope", noop); !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("Subscribe to a missing topic: got %v, want ErrNotFound", err)
	}
	if err := c.Publish(ctxT(t), "orders.dlq", &omnibus.Message{Body: []byte("x")}); err != nil {
		t.Errorf("Publish to a dead-letter topic (created by default): %v", err)
	}

	none := transporttest.Open(t, clusterURL(cluster, "create_topics=none"))
	if err := none.Publish(ctxT(t), "other.dlq", &omnibus.Message{Body: []byte("x")}); !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("create_topics=none, Publish to a missing dead-letter topic: got %v, want ErrNotFound", err)
	}

	all := transporttest.Open(t, clusterURL(cluster, "create_topics=all&partitions=3"))
	if err := all.Publish(ctxT(t), "auto", &omnibus.Message{Body: []byte("x")}); err != nil {
		t.Errorf("create_topics=all, Publish to a missing topic: %v", err)
	}
	if got := len(cluster.PartitionInfos("auto")); got != 3 {
		t.Errorf("auto-created topic has %d partitions, want 3", got)
	}

	if err := c.CreateTopic(ctxT(t), "grow", 2); err != nil {
		t.Fatalf("CreateTopic(2): %v", err)
	}
	if err := c.CreateTopic(ctxT(t), "grow", 5); err != nil {
		t.Fatalf("CreateTopic(5) on a 2-partition topic: %v", err)
	}
	if err := c.CreateTopic(ctxT(t), "grow", 3); err != nil {
		t.Fatalf("CreateTopic(3) on a 5-partition topic: %v", err)
	}
	if got := len(cluster.PartitionInfos("grow")); got != 5 {
		t.Errorf("topic has %d partitions, want 5 (grown, never shrunk)", got)
	}
}

// TestNewPartitions: partitions added while a group consumes are picked
// up, and read from their beginning even by a group that started at the
// latest message.
func TestNewPartitions(t *testing.T) {
	cluster := newCluster(t)
	url := clusterURL(cluster, "")
	admin := transporttest.Open(t, url)
	if err := admin.CreateTopic(ctxT(t), "growing", 2); err != nil {
		t.Fatal(err)
	}
	seen := newIDs()
	laneSeen := sync.Map{}
	h := func(ctx context.Context, m *omnibus.Message) error {
		laneSeen.Store(m.Lane, true)
		return seen.handler(ctx, m)
	}
	k, err := transporttest.Open(t, url).Subscribe(ctxT(t), "growing", h, omnibus.Group("grow"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	// Another client adds partitions, as an operator would.
	if err := admin.CreateTopic(ctxT(t), "growing", 6); err != nil {
		t.Fatal(err)
	}
	var ms []*omnibus.Message
	for i := range 300 {
		ms = append(ms, &omnibus.Message{Key: "key-" + strconv.Itoa(i), Body: []byte("x")})
	}
	if err := admin.Publish(ctxT(t), "growing", ms...); err != nil {
		t.Fatal(err)
	}
	transporttest.Eventually(t, time.Minute, func() bool { return seen.unique() == len(ms) }, func() string {
		var lanes []string
		laneSeen.Range(func(k, _ any) bool { lanes = append(lanes, k.(string)); return true })
		return fmt.Sprintf("received %d of %d; lanes seen %v", seen.unique(), len(ms), lanes)
	})
	for p := range 6 {
		if _, ok := laneSeen.Load(strconv.Itoa(p)); !ok {
			t.Errorf("nothing received from partition %d", p)
		}
	}
}

// TestLagUnknown: when the cluster cannot be read, lag is unknown, never
// zero.
func TestLagUnknown(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(3, "lagging"))
	if err != nil {
		t.Fatal(err)
	}
	c := transporttest.Open(t, clusterURL(cluster, "request_timeout=1s"))
	k, err := c.Subscribe(ctxT(t), "lagging", newIDs().handler, omnibus.Group("lag"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := c.Publish(ctxT(t), "lagging", &omnibus.Message{Key: "a", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	lags, err := k.Lag(ctxT(t))
	if err != nil || len(lags) != 3 {
		t.Fatalf("Lag: %v %v, want 3 lanes", lags, err)
	}
	var sum int64
	for _, l := range lags {
		if !l.Known {
			t.Fatalf("lane %s unknown with the cluster up", l.Lane)
		}
		sum += l.Lag
	}
	if sum != 1 {
		t.Errorf("lag %d with one unconsumed message, want 1 (%+v)", sum, lags)
	}
	// From outside the group, as omnibus lag does.
	outside, err := c.Lag(ctxT(t), "lagging", "lag")
	if err != nil || len(outside) != 3 {
		t.Fatalf("Client.Lag: %v %v, want 3 lanes", outside, err)
	}
	if _, err := c.Lag(ctxT(t), "lagging", "no-such-group"); !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("Client.Lag of a missing group: %v, want ErrNotFound", err)
	}
	cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	lags, err = k.Lag(ctx)
	if err == nil {
		for _, l := range lags {
			if l.Known {
				t.Errorf("lane %s known (lag %d) with the cluster down", l.Lane, l.Lag)
			}
		}
	}
	t.Logf("with the cluster down: %+v, %v", lags, err)
}

// TestURL: parameters are validated and errors never show the password.
func TestURL(t *testing.T) {
	cluster := newCluster(t)
	addr := cluster.ListenAddrs()[0]
	for _, tc := range []struct {
		name, url string
		want      error
	}{
		{"unknown parameter", "kafka://u:pw1@" + addr + "?acks=all", omnibus.ErrInvalid},
		{"bad compression", "kafka://u:pw1@" + addr + "?compression=brotli", omnibus.ErrInvalid},
		{"bad duration", "kafka://u:pw1@" + addr + "?linger=soon", omnibus.ErrInvalid},
		{"bad mechanism", "kafka://u:pw1@" + addr + "?mechanism=GSSAPI", omnibus.ErrInvalid},
		{"bad create_topics", "kafka://u:pw1@" + addr + "?create_topics=maybe", omnibus.ErrInvalid},
		{"no host", "kafka://u:pw1@/?linger=1ms", omnibus.ErrInvalid},
		{"bad durability", "kafka://u:pw1@" + addr + "?durability=most", omnibus.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := omnibus.Open(ctxT(t), tc.url)
			if err == nil {
				_ = c.Close()
				t.Fatalf("Open(%s) succeeded", tc.url)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
			if strings.Contains(err.Error(), "pw1") {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
	// Every parameter accepted, two seed brokers, one without a port.
	full := "kafka://" + strings.Join(cluster.ListenAddrs()[:2], ",") + "?client_id=t&tls=false&create_topics=all&partitions=2&replication_factor=3" +
		"&compression=zstd&linger=1ms&max_message_bytes=2000000&max_buffered_records=500&idempotent=true&delivery_timeout=30s" +
		"&request_timeout=5s&session_timeout=10s&heartbeat_interval=1s&rebalance_timeout=10s&fetch_max_wait=50ms" +
		"&fetch_max_bytes=1000000&fetch_max_partition_bytes=500000&metadata_max_age=10s&dial_timeout=2s&durability=leader"
	c := transporttest.Open(t, full)
	if got := c.Capabilities().MaxMessageBytes; got != 2000000-512 {
		t.Errorf("MaxMessageBytes %d, want 2000000 less 512", got)
	}
	if err := c.Publish(ctxT(t), "zstd", &omnibus.Message{Key: "k", Body: []byte("compressed")}); err != nil {
		t.Errorf("Publish with zstd, leader acks: %v", err)
	}
}

// TestDurability: every durability level publishes (acks 0, 1 and all
// are separate producers).
func TestDurability(t *testing.T) {
	cluster := newCluster(t, kfake.SeedTopics(2, "acks"))
	for _, d := range []omnibus.Durability{omnibus.DurabilityAll, omnibus.DurabilityLeader, omnibus.DurabilityNone} {
		c := transporttest.Open(t, clusterURL(cluster, "durability="+d.String()))
		if err := c.Publish(ctxT(t), "acks", &omnibus.Message{Key: d.String(), Body: []byte("x")}); err != nil {
			t.Errorf("durability %s: %v", d, err)
		}
	}
}

// TestSASL: SCRAM and PLAIN credentials come from the URL's user info.
func TestSASL(t *testing.T) {
	cluster := newCluster(t, kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "admin", "adm1n-secret"),
		kfake.Superuser("PLAIN", "plainuser", "plain-secret"),
		kfake.SeedTopics(1, "secure"))
	hosts := strings.Join(cluster.ListenAddrs(), ",")
	for _, u := range []string{
		"kafka://admin:adm1n-secret@" + hosts + "?mechanism=SCRAM-SHA-256",
		"kafka://plainuser:plain-secret@" + hosts,
	} {
		c := transporttest.Open(t, u)
		if err := c.Publish(ctxT(t), "secure", &omnibus.Message{Body: []byte("x")}); err != nil {
			t.Errorf("Publish over SASL: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, "kafka://admin:wrong-pw@"+hosts+"?mechanism=SCRAM-SHA-256")
	if err == nil {
		_ = c.Close()
		t.Fatal("Open with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), "wrong-pw") {
		t.Errorf("error shows the password: %v", err)
	}
	t.Logf("wrong password: %v", err)
}

// TestOldMessage: a message whose Time is long past (a dead letter, an
// outbox relay) publishes and keeps its Time; the record timestamp is the
// publish time, so neither the delivery timeout nor retention counts from
// the message's Time.
func TestOldMessage(t *testing.T) {
	cluster := newCluster(t, kfake.SeedTopics(1, "old"))
	c := transporttest.Open(t, clusterURL(cluster, "delivery_timeout=1s"))
	when := time.Now().Add(-365 * 24 * time.Hour).UTC()
	m := &omnibus.Message{Time: when, Body: []byte("from last year")}
	if err := c.Publish(ctxT(t), "old", m); err != nil {
		t.Fatalf("Publish of a year-old message: %v", err)
	}
	var mu sync.Mutex
	var got *omnibus.Message
	k, err := c.Subscribe(ctxT(t), "old", func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		defer mu.Unlock()
		cp := *m
		got = &cp
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	transporttest.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return got != nil }, func() string { return "not received" })
	mu.Lock()
	defer mu.Unlock()
	if !got.Time.Equal(when) {
		t.Errorf("Time %v, want %v", got.Time, when)
	}
}

package kafkabus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/kafkabus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// produceGate holds the produce requests the brokers of a cluster
// receive while it is shut, until it opens; then the brokers handle them
// as usual.
type produceGate struct {
	mu   sync.Mutex
	shut chan struct{} // nil while open
	held atomic.Int32  // produce requests held so far
}

func gateProduce(t *testing.T, cluster *kfake.Cluster) *produceGate {
	g := &produceGate{}
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		g.mu.Lock()
		shut := g.shut
		g.mu.Unlock()
		if shut != nil {
			g.held.Add(1)
			cluster.SleepControl(func() { <-shut })
		}
		return nil, nil, false
	})
	t.Cleanup(g.open)
	return g
}

func (g *produceGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *produceGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// reshut opens the gate for the requests it holds and holds those that
// come after.
func (g *produceGate) reshut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
	}
	g.shut = make(chan struct{})
}

// goroutinesIn counts the goroutines of omnibus or kafkabus running
// function in (a part of a stack trace such as "kafkabus.(*conn).Publish(")
// and not out ("" for any).
func goroutinesIn(in, out string) int {
	n := 0
	for _, g := range ours() {
		if strings.Contains(g, in) && (out == "" || !strings.Contains(g, out)) {
			n++
		}
	}
	return n
}

// sent is what a message was when it was published.
type sent struct {
	body   []byte
	header string
}

// distinct returns n messages of key, each with a body and a header
// of its own, and what each is, by ID.
func distinct(prefix, key string, n int) ([]*omnibus.Message, map[string]sent) {
	ms := make([]*omnibus.Message, n)
	want := make(map[string]sent, n)
	for i := range ms {
		id := fmt.Sprintf("%s-%d", prefix, i)
		body := bytes.Repeat([]byte(id+"."), 300/(len(id)+1))
		ms[i] = &omnibus.Message{ID: id, Key: key, Body: body, Headers: map[string]string{"n": id}}
		want[id] = sent{body: bytes.Clone(body), header: id}
	}
	return ms, want
}

// overwrite does to ms what a caller that owns its messages again may
// do: it writes over every body's bytes, header and field.
func overwrite(ms []*omnibus.Message) {
	for _, m := range ms {
		for i := range m.Body {
			m.Body[i] = 'X'
		}
		m.Headers["n"] = "overwritten"
		m.ID, m.Key, m.Type = "overwritten", "overwritten", "overwritten"
	}
}

// checkLanded reads topic back and checks each record against what was
// published: every record is a message as it was when published, byte
// for byte, the messages of must exactly once, those of may (published
// with an unknown outcome) at most once.
func checkLanded(t *testing.T, cluster *kfake.Cluster, topic string, must, may map[string]sent) {
	t.Helper()
	got := readRecords(t, cluster, topic)
	landed := 0
	for id, rs := range got {
		want, ok := must[id]
		if !ok {
			want, ok = may[id]
		}
		if !ok {
			t.Errorf("a record with ce_id %q, which was not published", id)
			continue
		}
		if len(rs) > 1 {
			t.Errorf("message %s is in the topic %d times", id, len(rs))
		}
		for _, r := range rs {
			var header string
			for _, h := range r.Headers {
				if h.Key == "ce_n" { // a header is an extension attribute
					header = string(h.Value)
				}
			}
			if !bytes.Equal(r.Value, want.body) || header != want.header {
				t.Errorf("message %s landed as body %.40q…, header %q; published as %.40q…, %q", id, r.Value, header, want.body, want.header)
			}
		}
		if _, ok := may[id]; ok {
			landed++
		}
	}
	for id := range must {
		if len(got[id]) == 0 {
			t.Errorf("message %s is not in the topic", id)
		}
	}
	t.Logf("%d of %d messages of unknown outcome landed", landed, len(may))
}

// warmUp publishes one message of key to topic, before the test holds
// anything back (the client has its connections and metadata), and
// returns it as the first of the messages that must land.
func warmUp(t *testing.T, c *omnibus.Client, topic, key string) map[string]sent {
	t.Helper()
	warm, must := distinct("warm", key, 1)
	if err := c.Publish(ctxT(t), topic, warm...); err != nil {
		t.Fatalf("Publish before the test holds anything back: %v", err)
	}
	return must
}

// gatedClient starts a cluster holding topic (two partitions), whose
// produce requests pass a gate, and a client with the URL parameters
// params, which publishes one message of key (all the test's messages
// are of it, on one partition) before the gate shuts: the message must
// land.
func gatedClient(t *testing.T, topic, params string) (*kfake.Cluster, *produceGate, *omnibus.Client, string, map[string]sent) {
	t.Helper()
	cluster := newCluster(t, kfake.SeedTopics(2, topic))
	gate := gateProduce(t, cluster)
	c := transporttest.Open(t, clusterURL(cluster, params))
	key := keysOf(0, 1)[0]
	return cluster, gate, c, key, warmUp(t, c, topic, key)
}

// TestPublishReturnedEarly: once Client.Publish has returned because its
// context ended while Kafka had not answered, nothing of omnibus or
// franz-go reads the caller's messages any more: the caller writes over
// their bodies, headers and fields at once and publishes others (which
// take the record sets given back meanwhile) before the broker answers,
// and every record that lands is a message as it was when published.
// Run with -race: a late read of a body is a race with the caller.
func TestPublishReturnedEarly(t *testing.T) {
	const topic = "returned-early"
	// Batches of one record, so that most of a publish waits in
	// franz-go's buffer behind the requests the broker holds.
	cluster, gate, c, key, must := gatedClient(t, topic, "max_message_bytes=512")

	gate.close()
	early, may := distinct("early", key, 50)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- c.Publish(ctx, topic, early...) }()
	transporttest.Eventually(t, 20*time.Second, func() bool { return gate.held.Load() > 0 }, func() string { return "the broker holds a produce request" })
	cancel()
	if err := <-done; !errors.Is(err, omnibus.ErrOutcomeUnknown) {
		t.Fatalf("Publish whose context ended while the broker held its records: %v, want an error wrapping ErrOutcomeUnknown", err)
	}
	overwrite(early)

	later, want := distinct("later", key, 50)
	maps.Copy(must, want)
	go func() { done <- c.Publish(ctxT(t), topic, later...) }()
	gate.open()
	if err := <-done; err != nil {
		t.Fatalf("Publish after: %v", err)
	}
	checkLanded(t, cluster, topic, must, may)
}

// TestCoalescedPublishReturnedEarly: a Client.Publish sent together with
// concurrent ones (coalesced into one producing batch) that returns when
// its context ends, while the others keep the batch going, leaves its
// messages to the caller as well: the records franz-go writes after it
// returned (the broker holds the first ones) are the messages as
// published, not what the caller wrote over them since.
func TestCoalescedPublishReturnedEarly(t *testing.T) {
	const topic = "coalesced-early"
	cluster, gate, c, key, must := gatedClient(t, topic, "max_message_bytes=512")

	// Four publishes in flight, held by the broker: the next ones wait
	// to be sent together.
	gate.close()
	const inflight = 4 // omnibus's coalesceInFlight
	done := make(chan error, inflight+1)
	for i := range inflight {
		ms, want := distinct(fmt.Sprintf("filler%d", i), key, 1)
		maps.Copy(must, want)
		go func() { done <- c.Publish(ctxT(t), topic, ms...) }()
	}
	transporttest.Eventually(t, 20*time.Second, func() bool {
		return goroutinesIn("kafkabus.(*conn).Publish(", "") == inflight
	}, func() string { return "four publishes in franz-go's producer" })
	early, may := distinct("early", key, 20)
	ctx, cancel := context.WithCancel(ctxT(t))
	earlyDone := make(chan error, 1)
	go func() { earlyDone <- c.Publish(ctx, topic, early...) }()
	later, want := distinct("later", key, 20)
	maps.Copy(must, want)
	go func() { done <- c.Publish(ctxT(t), topic, later...) }()
	transporttest.Eventually(t, 20*time.Second, func() bool {
		return goroutinesIn("omnibus.(*Client).send(", "kafkabus.(*conn).Publish(") == 2
	}, func() string { return "two publishes waiting to be sent together" })

	// The four land; the two waiting leave together, and the broker
	// holds their first records.
	gate.reshut()
	transporttest.Eventually(t, 20*time.Second, func() bool {
		return goroutinesIn("omnibus.(*Client).sendTogether(", "") == 1
	}, func() string { return "the two publishes sent together" })
	cancel()
	if err := <-earlyDone; !errors.Is(err, omnibus.ErrOutcomeUnknown) {
		t.Fatalf("Publish whose context ended after it was sent together with another: %v, want an error wrapping ErrOutcomeUnknown", err)
	}
	overwrite(early)
	gate.open()
	for range inflight + 1 {
		if err := <-done; err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	checkLanded(t, cluster, topic, must, may)
}

// TestPublisherResultsLeaveMessages: a Publisher's message is the
// caller's again once its result is ready, whichever way it ended. On a
// broker that holds every produce request, with room in franz-go's buffer
// for a few records: the first messages are in flight, the next wait in
// franz-go's buffer or in the Publisher's queue, some of those with
// contexts that end there; Close's context ends. The caller writes over
// each message the moment its result is ready, while a second Publisher
// (taking the batch arrays and record sets given back) publishes others;
// then the broker answers. Every record that lands is a message as
// published: none whose context ended before it was sent, those of
// unknown outcome at most once, the landed and the second Publisher's
// exactly once.
func TestPublisherResultsLeaveMessages(t *testing.T) {
	const topic = "publisher-early"
	cluster, gate, c, key, must := gatedClient(t, topic, "max_message_bytes=512&max_buffered_records=10")

	gate.close()
	p, err := c.Publisher(omnibus.BatchSize(5, 1<<20), omnibus.Senders(1))
	if err != nil {
		t.Fatal(err)
	}
	type given struct {
		m       *omnibus.Message
		r       *omnibus.PublishResult
		dropped bool // its context ended before it could be sent
		reused  chan struct{}
	}
	var gs []*given
	publish := func(ctx context.Context, ms []*omnibus.Message, dropped bool) {
		for _, m := range ms {
			r, err := p.Publish(ctx, topic, m)
			if err != nil {
				t.Fatalf("Publish: %v", err)
			}
			g := &given{m: m, r: r, dropped: dropped, reused: make(chan struct{})}
			gs = append(gs, g)
			go func() {
				<-r.Ready()
				overwrite([]*omnibus.Message{g.m})
				close(g.reused)
			}()
		}
	}
	first, published := distinct("first", key, 30)
	publish(ctxT(t), first[:20], false)
	transporttest.Eventually(t, 20*time.Second, func() bool { return gate.held.Load() > 0 }, func() string { return "the broker holds a produce request" })
	ctx, cancel := context.WithCancel(ctxT(t))
	publish(ctx, first[20:], true)
	cancel()

	closeCtx, stop := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer stop()
	if err := p.Close(closeCtx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close while the broker holds every request: %v, want the context's error", err)
	}
	may := map[string]sent{}
	var dropped, unknown int
	for _, g := range gs {
		<-g.reused
		id := g.r.ID()
		switch err := g.r.Err(); {
		case err == nil:
			t.Errorf("message %s landed while the broker held every request", id)
		case g.dropped && errors.Is(err, context.Canceled) && !errors.Is(err, omnibus.ErrOutcomeUnknown):
			dropped++ // not sent: it must not land
		case errors.Is(err, omnibus.ErrOutcomeUnknown):
			unknown++
			may[id] = published[id]
		default:
			t.Errorf("message %s (context ended before it was sent: %v): %v", id, g.dropped, err)
		}
	}
	t.Logf("%d messages of unknown outcome, %d not sent", unknown, dropped)
	if dropped == 0 {
		t.Error("no message whose context ended was left unsent: they all left before it ended")
	}

	p2, err := c.Publisher(omnibus.BatchSize(5, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	later, want := distinct("later", key, 30)
	maps.Copy(must, want)
	var rs []*omnibus.PublishResult
	for _, m := range later {
		r, err := p2.Publish(ctxT(t), topic, m)
		if err != nil {
			t.Fatalf("Publish: %v", err)
		}
		rs = append(rs, r)
	}
	gate.open()
	if err := p2.Close(ctxT(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, r := range rs {
		if err := r.Err(); err != nil {
			t.Errorf("message %d of the second Publisher: %v", i, err)
		}
	}
	checkLanded(t, cluster, topic, must, may)
}

// stallDialer dials as net.Dialer does, and while stalled its
// connections' writes wait, as on a socket the broker stopped reading:
// what franz-go has written so far is on the wire, what it writes next
// waits in Write, and the requests behind wait their turn to be written.
type stallDialer struct {
	mu      sync.Mutex
	stall   chan struct{} // nil while writes go through
	waiting atomic.Int32  // writes waiting
}

func (d *stallDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: conn, d: d}, nil
}

func (d *stallDialer) set(stalled bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case stalled && d.stall == nil:
		d.stall = make(chan struct{})
	case !stalled && d.stall != nil:
		close(d.stall)
		d.stall = nil
	}
}

type stallConn struct {
	net.Conn
	d *stallDialer
}

func (c *stallConn) Write(p []byte) (int, error) {
	c.d.mu.Lock()
	stall := c.d.stall
	c.d.mu.Unlock()
	if stall != nil {
		c.d.waiting.Add(1)
		<-stall
		c.d.waiting.Add(-1)
	}
	return c.Conn.Write(p)
}

// TestPublishReturnedWhileWriteStuck: a Client.Publish that returns when
// its context ends while franz-go's writes to the broker are stuck (the
// first produce request in Write, the next ones waiting to be written)
// leaves its messages to the caller: once the socket drains, what
// franz-go writes of them is the messages as published, not what the
// caller wrote over them since. franz-go keeps this: it fails, unsent,
// the requests of records whose context ended (kafkabus asks for that
// with AllowIdempotentProduceCancellation; without it, 5 or 6 of the 8
// messages landed with the caller's new bodies).
func TestPublishReturnedWhileWriteStuck(t *testing.T) {
	const topic = "write-stuck"
	cluster := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	dialer := &stallDialer{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := omnibus.Open(ctx, clusterURL(cluster, "max_message_bytes=512"),
		omnibus.WithDriver(kafkabus.New(kafkabus.WithClientOpts(kgo.Dialer(dialer.DialContext)))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := keysOf(0, 1)[0]
	must := warmUp(t, c, topic, key)

	dialer.set(true)
	defer dialer.set(false)
	may := map[string]sent{}
	done := make(chan error, 8)
	var early [][]*omnibus.Message
	for i := range 8 { // one record a batch: several requests, one stuck in Write and the others behind it
		ms, want := distinct(fmt.Sprintf("early%d", i), key, 1)
		maps.Copy(may, want)
		early = append(early, ms)
		ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
		defer cancel()
		go func() { done <- c.Publish(ctx, topic, ms...) }()
	}
	transporttest.Eventually(t, 20*time.Second, func() bool { return dialer.waiting.Load() > 0 },
		func() string { return "a produce request stuck in Write" })
	for range early {
		if err := <-done; err == nil {
			t.Fatal("Publish returned nil while its request could not be written")
		}
	}
	for _, ms := range early {
		overwrite(ms)
	}
	dialer.set(false)
	later, want := distinct("later", key, 5)
	maps.Copy(must, want)
	if err := c.Publish(ctxT(t), topic, later...); err != nil {
		t.Fatalf("Publish after the writes go through again: %v", err)
	}
	checkLanded(t, cluster, topic, must, may)
}

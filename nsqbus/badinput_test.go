package nsqbus_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/nsqtest"
	"github.com/omnibus-go/omnibus/transporttest"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestUnreachable: an nsqd or nsqlookupd that does not answer fails
// Open at once, naming the address and hiding the secret.
func TestUnreachable(t *testing.T) {
	addr := closedAddr(t)
	for _, u := range []string{
		"nsq://secret-token-1@" + addr + "?dial_timeout=1s",
		"nsq://secret-token-1@" + addr + "?lookup=true&dial_timeout=1s",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		_, err := omnibus.Open(ctx, u)
		cancel()
		if err == nil {
			t.Fatalf("Open(%q) succeeded", u)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("Open(%q) took %v, want a fast failure", u, d)
		}
		if strings.Contains(err.Error(), "secret-token-1") || !strings.Contains(err.Error(), addr) {
			t.Errorf("Open(%q): %v; want the address named and the secret hidden", u, err)
		}
		t.Logf("%v", err)
	}
}

// TestURLErrors: unknown parameters, bad values and URLs without a
// host are ErrInvalid, naming what is wrong, the secret hidden.
func TestURLErrors(t *testing.T) {
	ctx := context.Background()
	for u, want := range map[string]string{
		"nsq://127.0.0.1:4150?lookpu=true":                   "lookpu",
		"nsq://127.0.0.1:4150?msg_timeout=100ms":             "msg_timeout",
		"nsq://127.0.0.1:4150?max_message_bytes=-1":          "max_message_bytes",
		"nsq://127.0.0.1:4161?lookup=true&http_port=4151":    "http_port",
		"nsq://127.0.0.1:4150?lookup=maybe":                  "lookup",
		"nsq://127.0.0.1:4150,?poll_interval=1s":             "4150,",
		"nsq://127.0.0.1:4150/orders":                        "path",
		"nsq://top-secret-1@127.0.0.1:4150?dial_timeout=zzz": "dial_timeout",
	} {
		_, err := omnibus.Open(ctx, u)
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q): got %v, want ErrInvalid naming %s", u, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "top-secret-1") {
			t.Errorf("Open(%q): the error shows the secret: %v", u, err)
		}
	}
}

// TestBadNames: topic and group names NSQ cannot take are ErrInvalid
// before anything is sent; long ones are shortened alike everywhere.
func TestBadNames(t *testing.T) {
	c := transporttest.Open(t, directURL(t))
	ctx := context.Background()
	h := func(context.Context, *omnibus.Message) error { return nil }
	for _, topic := range []string{"orders created", "orders/eu", "orders#ephemeral", "zażółć"} {
		if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); !errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("Publish to %q: got %v, want ErrInvalid", topic, err)
		}
		if _, err := c.Subscribe(ctx, topic, h); !errors.Is(err, omnibus.ErrInvalid) {
			t.Errorf("Subscribe to %q: got %v, want ErrInvalid", topic, err)
		}
	}
	if _, err := c.Subscribe(ctx, "names", h, omnibus.Group("billing/eu")); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("Subscribe with group %q: got %v, want ErrInvalid", "billing/eu", err)
	}
	long := strings.Repeat("a", 100)
	col := newCollector()
	k, err := c.Subscribe(ctx, long, col.handle, omnibus.Group(long))
	if err != nil {
		t.Fatalf("Subscribe to a topic of 100 bytes: %v", err)
	}
	transporttest.RunConsumer(t, k)
	m := &omnibus.Message{Body: []byte("long")}
	if err := c.Publish(ctx, long, m); err != nil {
		t.Fatalf("Publish to a topic of 100 bytes: %v", err)
	}
	awaitAll(t, 30*time.Second, []string{m.ID}, col)
	n, _ := cluster(t)
	names, err := nsqtest.Topics(n.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasPrefix(name, "aaaa") {
			if len(name) > 64 {
				t.Errorf("nsqd holds topic %q of %d bytes", name, len(name))
			}
			deleteTopic(t, name)
		}
	}
}

// TestTooLarge: a message over nsqd's max-msg-size fails alone with
// ErrTooLarge and the rest of its batch lands: checked before sending
// when the limit is nsqd's own, and mapped from nsqd's refusal when the
// URL claims a larger limit than nsqd enforces.
func TestTooLarge(t *testing.T) {
	n := nsqtest.StartNSQD(t, nsqtest.Config{MaxMsgSize: 64 << 10})
	for name, u := range map[string]string{
		"known": n.URL(testParams, "max_message_bytes=1048576"), // lowered to nsqd's
		// nsqd's limit unknown (no HTTP API there), so nsqd's default
		// is assumed, and nsqd refuses.
		"refused": n.URL(testParams, "http_port="+closedPort(t)),
	} {
		t.Run(name, func(t *testing.T) {
			c := transporttest.Open(t, u)
			ctx := context.Background()
			topic := "too-large-" + name
			col := newCollector()
			k, err := transporttest.Open(t, n.URL(testParams)).Subscribe(ctx, topic, col.handle, omnibus.Group("g"))
			if err != nil {
				t.Fatal(err)
			}
			transporttest.RunConsumer(t, k)
			// Under MaxMessageBytes, as the engine counts it, yet over
			// nsqd's limit once encoded (every byte of the header value
			// is escaped as \u00XX).
			escaped := strings.Repeat("\x01", 15<<10)
			ms := []*omnibus.Message{
				{Body: []byte("small 1")},
				{Body: make([]byte, 200<<10)},
				{Body: []byte("small 2"), Headers: map[string]string{"note": escaped}},
				{Body: []byte("small 3")},
			}
			if name == "known" && c.Capabilities().MaxMessageBytes >= 64<<10 {
				t.Errorf("MaxMessageBytes %d, want under nsqd's 64 KiB (the envelope's base64)", c.Capabilities().MaxMessageBytes)
			}
			err = c.Publish(ctx, topic, ms...)
			var pe *omnibus.PublishError
			if !errors.As(err, &pe) || !errors.Is(err, omnibus.ErrTooLarge) {
				t.Fatalf("Publish: got %v, want a *PublishError with ErrTooLarge", err)
			}
			failed := map[int]bool{}
			for _, f := range pe.Failed {
				failed[f.Index] = true
				if !errors.Is(f.Err, omnibus.ErrTooLarge) {
					t.Errorf("message %d: %v, want ErrTooLarge", f.Index, f.Err)
				}
			}
			if len(failed) != 2 || !failed[1] || !failed[2] {
				t.Errorf("failed %v, want messages 1 and 2", pe.Failed)
			}
			awaitAll(t, 30*time.Second, []string{ms[0].ID, ms[3].ID}, col)
			t.Logf("%v", err)
		})
	}
}

// TestAuth: nsqd asks an auth server about each connection's secret. A
// refused secret fails Open, and the error does not show it; the right
// one publishes and consumes.
func TestAuth(t *testing.T) {
	const secret = "open-sesame-42"
	authd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("secret") != secret {
			http.Error(w, `{"message":"NOT_AUTHORIZED"}`, http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ttl":3600,"identity":"test","authorizations":[{"topic":".*","channels":[".*"],"permissions":["subscribe","publish"]}]}`))
	}))
	defer authd.Close()
	n := nsqtest.StartNSQD(t, nsqtest.Config{AuthHTTPAddress: strings.TrimPrefix(authd.URL, "http://")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, u := range []string{
		"nsq://wrong-secret-77@" + n.TCPAddr() + "?" + testParams,
		"nsq://:wrong-secret-77@" + n.TCPAddr() + "?" + testParams,
		"nsq://" + n.TCPAddr() + "?" + testParams,
	} {
		_, err := omnibus.Open(ctx, u)
		if err == nil {
			t.Fatalf("Open(%q) succeeded", omnibus.RedactURL(u))
		}
		if strings.Contains(err.Error(), "wrong-secret-77") {
			t.Errorf("the error shows the secret: %v", err)
		}
		t.Logf("%v", err)
	}
	c := transporttest.Open(t, "nsq://"+secret+"@"+n.TCPAddr()+"?"+testParams)
	col := newCollector()
	k, err := c.Subscribe(ctx, "auth", col.handle, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	m := &omnibus.Message{Body: []byte("hello")}
	if err := c.Publish(ctx, "auth", m); err != nil {
		t.Fatal(err)
	}
	awaitAll(t, 30*time.Second, []string{m.ID}, col)
}

// TestRefusalAmidPipeline: publishers share a connection with one whose
// messages nsqd refuses (its limit unknown here). nsqd closes the
// connection after a refusal, and runs nothing sent after it: those
// commands go again on a new connection; when the close resets the
// connection (nsqd had not read the refused body) the answers in flight
// are lost, and those Publish calls fail saying so. A publisher that
// sends again until nil loses nothing, nothing hangs, and a large
// message never lands.
func TestRefusalAmidPipeline(t *testing.T) {
	n := nsqtest.StartNSQD(t, nsqtest.Config{MaxMsgSize: 16 << 10})
	c := transporttest.Open(t, n.URL(testParams, "http_port="+closedPort(t)))
	ctx := context.Background()
	const topic = "pipeline"
	col := newCollector()
	k, err := transporttest.Open(t, n.URL(testParams)).Subscribe(ctx, topic, col.handle, omnibus.Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	var (
		mu            sync.Mutex
		ids, large    []string
		lost, refused atomic.Int64
		wg            sync.WaitGroup
	)
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				ms := numbered(fmt.Sprintf("small-%d", g), i*10, 10, 100)
				for try := 0; ; try++ {
					err := c.Publish(ctx, topic, ms...)
					if err == nil {
						break
					}
					if errors.Is(err, omnibus.ErrTooLarge) || try == 20 {
						t.Errorf("small batch: %v", err)
						return
					}
					lost.Add(1)
				}
				mu.Lock()
				for _, m := range ms {
					ids = append(ids, m.ID)
				}
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			m := &omnibus.Message{Body: make([]byte, 32<<10)}
			err := c.Publish(ctx, topic, m)
			switch {
			case errors.Is(err, omnibus.ErrTooLarge):
				refused.Add(1)
			case err == nil:
				t.Errorf("a message over nsqd's limit landed")
			}
			mu.Lock()
			large = append(large, m.ID)
			mu.Unlock()
		}
	})
	wg.Wait()
	awaitAll(t, 30*time.Second, ids, col)
	if refused.Load() == 0 {
		t.Errorf("no large message failed with ErrTooLarge: nsqd's refusal was never read")
	}
	for _, id := range large {
		if col.missing([]string{id}) == nil {
			t.Errorf("large message %s was delivered", id)
		}
	}
	t.Logf("%d small messages landed (%d delivered twice; %d Publish calls lost their answers and went again); %d of 20 large ones refused with ErrTooLarge",
		len(ids), col.dups(), lost.Load(), refused.Load())
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	_, port, _ := net.SplitHostPort(closedAddr(t))
	return port
}

package omnibus_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/testenv"
	"github.com/omnibus-go/omnibus/membus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name, url string
		want      error
		contains  []string
	}{
		{"unknown scheme", "kafkaa://user:hunter2@host:9092", omnibus.ErrUnknownScheme, []string{`"kafkaa"`, "forgotten import", "mem"}},
		{"malformed", "mem://user:hunter2@[::1", omnibus.ErrInvalid, []string{"malformed URL"}},
		{"no scheme", "//localhost:9092", omnibus.ErrInvalid, []string{"no scheme"}},
		{"unknown parameter", "mem://user:hunter2@bus?partitons=3", omnibus.ErrInvalid, []string{"partitons", "known: durability, max_bytes, partitions"}},
		{"bad durability", "mem://user:hunter2@bus?durability=most", omnibus.ErrInvalid, []string{`"most"`}},
		{"bad value", "mem://bus?partitions=-2", omnibus.ErrInvalid, []string{"partitions"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := omnibus.Open(ctx, tt.url)
			if err == nil {
				c.Close()
				t.Fatalf("Open(%q) succeeded, want an error", tt.url)
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("Open(%q) = %v, want errors.Is %v", tt.url, err, tt.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the password: %v", err)
			}
			for _, s := range tt.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestRegisterPanics(t *testing.T) {
	for _, tt := range []struct {
		name   string
		scheme string
		d      driver.Driver
	}{
		{"duplicate", membus.Scheme, nilDriver{}},
		{"empty scheme", "", nilDriver{}},
		{"nil driver", "nil", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", tt.scheme)
				}
			}()
			omnibus.Register(tt.scheme, tt.d)
		})
	}
	if got := omnibus.Schemes(); len(got) == 0 || got[0] != "mem" {
		t.Errorf("Schemes() = %v, want mem registered", got)
	}
}

type nilDriver struct{}

func (nilDriver) Open(context.Context, *url.URL, driver.OpenOptions) (driver.Conn, error) {
	return nil, nil
}

func TestBadOptions(t *testing.T) {
	ctx := context.Background()
	c := openMem(t)
	h := func(context.Context, *omnibus.Message) error { return nil }
	tests := []struct {
		name string
		opt  omnibus.SubscribeOption
	}{
		{"zero in-flight", omnibus.MaxInFlight(0)},
		{"negative in-flight", omnibus.MaxInFlight(-1)},
		{"zero bytes", omnibus.MaxInFlightBytes(0)},
		{"zero attempts", omnibus.MaxAttempts(0)},
		{"negative backoff", omnibus.Backoff(-time.Second, time.Second)},
		{"backoff max below min", omnibus.Backoff(time.Second, time.Millisecond)},
		{"zero drain", omnibus.DrainTimeout(0)},
		{"zero commit interval", omnibus.CommitInterval(0)},
		{"zero consumers", omnibus.Members(0)},
		{"zero batch count", omnibus.Batch(0, 1, time.Second)},
		{"negative batch period", omnibus.Batch(10, 1000, -time.Millisecond)},
		{"empty group", omnibus.Group("")},
		{"empty dead-letter topic", omnibus.DeadLetterTopic("")},
		{"nil observer", omnibus.Observe(nil)},
		{"bad ordering", omnibus.Order(omnibus.Ordering(42))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := c.Subscribe(ctx, "t", h, tt.opt)
			if !errors.Is(err, omnibus.ErrInvalid) {
				if k != nil {
					k.Close()
				}
				t.Fatalf("Subscribe with %s: got %v, want ErrInvalid", tt.name, err)
			}
		})
	}
	if _, err := c.Subscribe(ctx, "t", nil); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("nil handler: got %v, want ErrInvalid", err)
	}
	if _, err := c.SubscribeBatch(ctx, "t", nil); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("nil batch handler: got %v, want ErrInvalid", err)
	}
	if _, err := c.Subscribe(ctx, "", h); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("empty topic: got %v, want ErrInvalid", err)
	}
	if err := c.Publish(ctx, "t", nil); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("nil message: got %v, want ErrInvalid", err)
	}
	if err := c.CreateTopic(ctx, "t", 0); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("zero lanes: got %v, want ErrInvalid", err)
	}
	if _, err := omnibus.New(nil); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("New(nil): got %v, want ErrInvalid", err)
	}
}

func TestCapabilityErrors(t *testing.T) {
	c, err := omnibus.New(unordered{membus.New(membus.Config{}).Conn()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := func(context.Context, *omnibus.Message) error { return nil }
	for _, tt := range []struct {
		opt        omnibus.SubscribeOption
		capability string
	}{
		{omnibus.Order(omnibus.OrderKey), "ordering"},
		{omnibus.Order(omnibus.OrderLane), "ordering"},
		{omnibus.StartFrom(omnibus.StartEarliest), "replay"},
	} {
		_, err := c.Subscribe(context.Background(), "t", h, tt.opt)
		var ce *omnibus.CapabilityError
		if !errors.As(err, &ce) || ce.Capability != tt.capability || !errors.Is(err, omnibus.ErrUnsupported) {
			t.Errorf("got %v, want a CapabilityError naming %q", err, tt.capability)
		}
	}
}

// unordered is a membus connection that declares neither order nor replay.
type unordered struct{ driver.Conn }

func (u unordered) Capabilities() driver.Capabilities {
	c := u.Conn.Capabilities()
	c.Ordered, c.Replay = false, false
	return c
}

func TestClosed(t *testing.T) {
	c := openMem(t)
	c.Close()
	ctx := context.Background()
	if err := c.Publish(ctx, "t", &omnibus.Message{}); !errors.Is(err, omnibus.ErrClosed) {
		t.Errorf("Publish after Close: %v", err)
	}
	if _, err := c.Subscribe(ctx, "t", func(context.Context, *omnibus.Message) error { return nil }); !errors.Is(err, omnibus.ErrClosed) {
		t.Errorf("Subscribe after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestBindingHeaders: a header a CloudEvents binding owns would arrive as
// something else, or make CloudEvents readers refuse the message; Publish
// refuses it, whatever the transport.
func TestBindingHeaders(t *testing.T) {
	c := openMem(t)
	defer c.Close()
	for _, name := range []string{"content-type", "Content-Type", "ce_tenant", "ce-id", "Ce-Type", "cloudEvents:id", "cloudEvents_x"} {
		ok := &omnibus.Message{Headers: map[string]string{"tenant": "acme"}}
		bad := &omnibus.Message{Headers: map[string]string{name: "x"}}
		err := c.Publish(context.Background(), "t", ok, bad)
		if !errors.Is(err, omnibus.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("header %q: Publish returned %v; want ErrInvalid naming it", name, err)
		}
	}
	if err := c.Publish(context.Background(), "t", &omnibus.Message{Headers: map[string]string{"trace-id": "x", "ce": "y"}}); err != nil {
		t.Errorf("headers that are no binding's: %v", err)
	}
}

func TestDurabilityFromURL(t *testing.T) {
	c, err := omnibus.Open(context.Background(), "mem://durability?durability=leader")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Durability() != omnibus.DurabilityLeader {
		t.Errorf("durability %v, want leader", c.Durability())
	}
}

// TestNoClientLibraries proves the portable layer pulls in no transport's
// client library: a program that uses only membus stays small.
func TestNoClientLibraries(t *testing.T) {
	for _, pkg := range []string{".", "./driver"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, banned := range []string{"franz-go", "amqp091", "nats-io", "aws-sdk", "go-redis", "jackc/pgx", "spf13"} {
				if strings.Contains(dep, banned) {
					t.Errorf("package %s depends on %s", pkg, dep)
				}
			}
		}
	}
}

func openMem(t testing.TB) *omnibus.Client {
	t.Helper()
	c, err := omnibus.New(membus.New(membus.Config{Partitions: 4}).Conn(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// quiet keeps the engine's expected error logs (injected panics) out of
// the test output.
func quiet() omnibus.Option {
	return omnibus.WithLogger(slog.New(slog.DiscardHandler))
}

// A client made from a driver connection is named after its transport, in
// its String and in its log lines.
func TestNewNamesTransport(t *testing.T) {
	buf := &testenv.Buffer{}
	c, err := omnibus.New(membus.New(membus.Config{}).Conn(), omnibus.WithLogger(slog.New(slog.NewTextHandler(buf, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.String() != "membus" {
		t.Errorf("String() = %q, want membus", c.String())
	}
	k, err := c.Subscribe(context.Background(), "t", func(context.Context, *omnibus.Message) error { panic("boom") })
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(context.Background())
	if err := c.Publish(context.Background(), "t", &omnibus.Message{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "handler panicked") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	k.Close()
	log := buf.String()
	if !strings.Contains(log, "transport=membus") || strings.Contains(log, "msg=\"omnibus:") {
		t.Errorf("log line %q: want transport=membus and a message without an omnibus: prefix", strings.SplitN(log, "\n", 2)[0])
	}
}

// driverFunc is a driver.Driver made of a function.
type driverFunc func(context.Context, *url.URL, driver.OpenOptions) (driver.Conn, error)

func (f driverFunc) Open(ctx context.Context, u *url.URL, o driver.OpenOptions) (driver.Conn, error) {
	return f(ctx, u, o)
}

// TestWithDriver: Open hands the URL to the driver given with
// WithDriver, whatever is registered for the scheme (or nothing), after
// reading the portable parameters and with the client's logger; New,
// which is given a connection, refuses a driver.
func TestWithDriver(t *testing.T) {
	ctx := context.Background()
	var got *url.URL
	var logger *slog.Logger
	d := driverFunc(func(_ context.Context, u *url.URL, o driver.OpenOptions) (driver.Conn, error) {
		got, logger = u, o.Logger
		return membus.New(membus.Config{}).Conn(), nil
	})
	for _, raw := range []string{"mem://user:hunter2@bus?durability=none&x=1", "unregistered://bus?durability=none&x=1"} {
		c, err := omnibus.Open(ctx, raw, omnibus.WithDriver(d), quiet())
		if err != nil {
			t.Fatalf("Open(%q, WithDriver): %v", raw, err)
		}
		if got == nil || got.Host != "bus" || got.RawQuery != "x=1" || logger == nil {
			t.Errorf("Open(%q): the driver was given %v (logger %v), want the URL without durability and a logger", raw, got, logger)
		}
		if c.Durability() != omnibus.DurabilityNone {
			t.Errorf("Open(%q): durability %v, want none from the URL", raw, c.Durability())
		}
		if strings.Contains(c.String(), "hunter2") {
			t.Errorf("Open(%q): String() = %q shows the password", raw, c.String())
		}
		_ = c.Close()
		got = nil
	}
	if _, err := omnibus.Open(ctx, "mem://bus", omnibus.WithDriver(nil)); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("WithDriver(nil): got %v, want ErrInvalid", err)
	}
	if _, err := omnibus.New(membus.New(membus.Config{}).Conn(), omnibus.WithDriver(d)); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("New with WithDriver: got %v, want ErrInvalid", err)
	}
}

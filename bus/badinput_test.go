package bus_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// Refund is a command billing has no handler for.
type Refund struct {
	Order string `json:"order"`
}

// Audit is a command billing fails transiently, every time.
type Audit struct {
	Order string `json:"order"`
}

// brokenCodec is JSON under a content type of its own, and fails to
// decode any body that says "broken".
type brokenCodec struct{}

func (brokenCodec) ContentType() string           { return "application/x-broken" }
func (brokenCodec) Marshal(v any) ([]byte, error) { return bus.JSON.Marshal(v) }
func (brokenCodec) Unmarshal(data []byte, v any) error {
	if strings.Contains(string(data), "broken") {
		return errors.New("broken codec")
	}
	return bus.JSON.Unmarshal(data, v)
}

// consume runs h over topic in group until the test ends.
func consume(t testing.TB, ctx context.Context, c *omnibus.Client, topic, group string, h omnibus.Handler) {
	t.Helper()
	k, err := c.Subscribe(ctx, topic, h, omnibus.Group(group))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = k.Run(ctx) }()
	t.Cleanup(func() { _ = k.Close() })
}

// deadLetters reads topic's dead-letter topic from now on and returns
// what it got so far: the reasons of each order's dead letters.
func deadLetters(t testing.TB, ctx context.Context, c *omnibus.Client, topic string) func() map[string][]string {
	t.Helper()
	dlq := topic + ".dlq"
	if err := c.CreateTopic(ctx, dlq, 1); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]string{}
	consume(t, ctx, c, dlq, "dlq-reader", func(ctx context.Context, m *omnibus.Message) error {
		order, _, _ := strings.Cut(strings.TrimPrefix(string(m.Body), `{"order":"`), `"`)
		mu.Lock()
		got[order] = append(got[order], m.Headers[omnibus.HeaderDeadReason])
		mu.Unlock()
		return nil
	})
	return func() map[string][]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(got)
	}
}

// eventually polls fn until it returns nil, failing t with its last
// error after d.
func eventually(t testing.TB, d time.Duration, fn func() error) {
	t.Helper()
	var last error
	transporttest.Eventually(t, d, func() bool { last = fn(); return last == nil }, func() string { return last.Error() })
}

func start(t testing.TB, ctx context.Context, b *bus.Bus) {
	t.Helper()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start %s: %v", b.Service(), err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Shutdown(sctx); err != nil {
			t.Errorf("Shutdown %s: %v", b.Service(), err)
		}
	})
}

// TestBadInput: on every transport, a command type nobody handles and
// a body that does not decode are dead-lettered with the reason (and a
// Request of either gets a fault at once, as does one whose command ran
// out of attempts); a Request whose deadline
// passes returns the context's error, and its late reply is counted and
// reaches no other Request.
func TestBadInput(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			ns := namespace()
			rawURL := tr.url(t, ns)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			billing, err := bus.New(transporttest.Open(t, rawURL), "billing", bus.Namespace(ns), bus.WithCodec(brokenCodec{}),
				bus.SubscribeCommands(omnibus.MaxAttempts(2), omnibus.Backoff(10*time.Millisecond, 20*time.Millisecond)))
			must(t, err)
			must(t, bus.HandleCommand(billing, func(ctx context.Context, inv bus.Invocation, a Audit) error {
				return errors.New("auditor busy")
			}))
			release, held, holding := make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
			must(t, bus.HandleCommand(billing, func(ctx context.Context, inv bus.Invocation, c ChargeCard) error {
				switch c.Order {
				case "slow":
					<-release
				case "held":
					select {
					case holding <- struct{}{}:
					default:
					}
					<-held
				}
				return inv.Reply(ctx, Charged{Order: c.Order})
			}))
			orders, err := bus.New(transporttest.Open(t, rawURL), "orders", bus.Namespace(ns), bus.WithCodec(brokenCodec{}))
			must(t, err)
			dead := deadLetters(t, ctx, transporttest.Open(t, rawURL), billing.CommandTopic("billing"))
			start(t, ctx, billing)
			start(t, ctx, orders)
			defer close(release)
			defer close(held)

			// A type nobody handles, sent and requested.
			must(t, orders.Send(ctx, "billing", Refund{Order: "refund-sent"}))
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
			_, err = bus.Request[Charged](rctx, orders, "billing", Refund{Order: "refund-requested"})
			rcancel()
			var fault *bus.FaultError
			if !errors.As(err, &fault) || !strings.Contains(fault.Reason, "no command handler for type") || fault.Type != "bus_test.Refund" {
				t.Errorf("Request of a type nobody handles: %v, want a *FaultError naming the missing handler", err)
			}

			// A command that fails until its attempts run out.
			rctx, rcancel = context.WithTimeout(ctx, 30*time.Second)
			_, err = bus.Request[Charged](rctx, orders, "billing", Audit{Order: "audit"})
			rcancel()
			if !errors.As(err, &fault) || !strings.Contains(fault.Reason, "auditor busy (attempt 2, the last)") {
				t.Errorf("Request of a command whose attempts ran out: %v, want a *FaultError with the last error", err)
			}

			// A body billing cannot decode: its codec fails, or no codec
			// has the content type.
			must(t, orders.Send(ctx, "billing", ChargeCard{Order: "broken-codec"}))
			raw := &omnibus.Message{Type: "bus_test.ChargeCard", ContentType: "text/plain", Body: []byte(`{"order":"text-plain"}`)}
			must(t, orders.Client().Publish(ctx, billing.CommandTopic("billing"), raw))

			want := map[string]string{
				"refund-sent":      `service "billing" has no command handler for type "bus_test.Refund"`,
				"refund-requested": `service "billing" has no command handler for type "bus_test.Refund"`,
				"broken-codec":     "as application/x-broken: broken codec: cannot decode message",
				"text-plain":       `no codec for content type "text/plain": cannot decode message`,
				"audit":            "auditor busy",
			}
			eventually(t, time.Minute, func() error {
				got := dead()
				for order, reason := range want {
					if r, ok := got[order]; !ok {
						return fmt.Errorf("no dead letter of %s (got %v)", order, got)
					} else if !strings.Contains(r[0], reason) {
						return fmt.Errorf("dead letter of %s: reason %q, want it to contain %q", order, r, reason)
					}
				}
				return nil
			})
			if s := billing.Stats(); s.Unhandled != 2 || s.Undecoded != 2 {
				t.Errorf("billing's stats %+v, want Unhandled 2 and Undecoded 2", s)
			}

			// A Request whose deadline passes; its reply comes later, while
			// another Request waits, and goes to no one.
			rctx, rcancel = context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = bus.Request[Charged](rctx, orders, "billing", ChargeCard{Order: "slow"})
			rcancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Request past its deadline: %v, want context.DeadlineExceeded", err)
			}
			type answer struct {
				r   Charged
				err error
			}
			waiting := make(chan answer, 1)
			go func() {
				rctx, rcancel := context.WithTimeout(ctx, time.Minute)
				defer rcancel()
				r, err := bus.Request[Charged](rctx, orders, "billing", ChargeCard{Order: "held"})
				waiting <- answer{r, err}
			}()
			<-holding
			release <- struct{}{}
			eventually(t, time.Minute, func() error {
				if s := orders.Stats(); s.LateReplies != 1 || s.Timeouts != 1 {
					return fmt.Errorf("orders' stats %+v, want LateReplies 1 and Timeouts 1", s)
				}
				return nil
			})
			held <- struct{}{}
			if a := <-waiting; a.err != nil || a.r.Order != "held" {
				t.Errorf("Request waiting while a late reply came: %+v, %v; want the reply of held", a.r, a.err)
			}
		})
	}
}

// TestRegistration: a handler registered twice is an error at
// registration, so is a handler after Start; a Request without a
// deadline is refused.
func TestRegistration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := bus.New(transporttest.Open(t, "mem://"+namespace()), "billing")
	must(t, err)
	h := func(context.Context, bus.Invocation, ChargeCard) error { return nil }
	must(t, bus.HandleCommand(b, h))
	if err := bus.HandleCommand(b, h); !errors.Is(err, bus.ErrDuplicateHandler) || !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("second command handler of a type: %v, want ErrDuplicateHandler", err)
	}
	// One handler per kind: the same type may be an event and a reply too.
	must(t, bus.HandleEvent(b, "orders", func(context.Context, bus.Invocation, ChargeCard) error { return nil }))
	if err := bus.HandleEventBatch(b, "orders", func(context.Context, []bus.Item[ChargeCard]) error { return nil }); !errors.Is(err, bus.ErrDuplicateHandler) {
		t.Errorf("second event handler of a type from one publisher: %v, want ErrDuplicateHandler", err)
	}
	must(t, bus.HandleEvent(b, "shipping", func(context.Context, bus.Invocation, ChargeCard) error { return nil }))
	if err := bus.HandleCommand(b, func(context.Context, bus.Invocation, map[string]any) error { return nil }); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("handler of an unnamed type: %v, want ErrInvalid", err)
	}
	start(t, ctx, b)
	subs := fmt.Sprint(b.Subscriptions())
	for _, want := range []string{"{reply bus.billing.replies omnibus-", "{command bus.billing.commands billing}", "{event bus.orders.events billing}", "{event bus.shipping.events billing}"} {
		if !strings.Contains(subs, want) {
			t.Errorf("Subscriptions %s, want one like %s", subs, want)
		}
	}
	if err := bus.HandleReply(b, func(context.Context, bus.Invocation, Charged) error { return nil }); !errors.Is(err, bus.ErrStarted) {
		t.Errorf("handler registered after Start: %v, want ErrStarted", err)
	}
	if _, err := bus.Request[Charged](context.Background(), b, "billing", ChargeCard{Order: "1"}); !errors.Is(err, bus.ErrNoDeadline) || !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("Request without a deadline: %v, want ErrNoDeadline", err)
	}
	if s := b.Stats(); s.Sent != 0 || s.Requests != 0 {
		t.Errorf("a refused Request sent something: %+v", s)
	}
	if _, err := bus.New(transporttest.Open(t, "mem://"+namespace()), "billing.eu"); !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("service name with a dot: %v, want ErrInvalid", err)
	}
}

// TestProtobufAndMiddleware: proto messages travel in the protobuf
// format with its content type; handler and send middleware run in the
// order given, around the handler and the publish.
func TestProtobufAndMiddleware(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := "mem://" + namespace()
	var mu sync.Mutex
	var trail []string
	note := func(s string) {
		mu.Lock()
		trail = append(trail, s)
		mu.Unlock()
	}
	handlerMW := func(name string) bus.Middleware {
		return func(next bus.Handler) bus.Handler {
			return func(ctx context.Context, c *bus.Call) error {
				note(name + " before " + c.Type)
				err := next(ctx, c)
				note(name + " after")
				return err
			}
		}
	}
	sendMW := func(name string) bus.SendMiddleware {
		return func(next bus.Sender) bus.Sender {
			return func(ctx context.Context, d *bus.Dispatch) error {
				for _, m := range d.Messages {
					m.Headers["trail"] += name
				}
				note(name + " send " + d.Kind.String())
				return next(ctx, d)
			}
		}
	}
	var contentType, trailHeader atomic.Value
	echo, err := bus.New(transporttest.Open(t, u), "echo", bus.Use(handlerMW("h1"), handlerMW("h2")))
	must(t, err)
	must(t, bus.HandleCommand(echo, func(ctx context.Context, inv bus.Invocation, s *wrapperspb.StringValue) error {
		note("handler")
		contentType.Store(inv.Message().ContentType)
		trailHeader.Store(inv.Message().Headers["trail"])
		return inv.Reply(ctx, wrapperspb.String("echo: "+s.GetValue()))
	}))
	caller, err := bus.New(transporttest.Open(t, u), "caller", bus.UseSend(sendMW("s1"), sendMW("s2")))
	must(t, err)
	start(t, ctx, echo)
	start(t, ctx, caller)
	r, err := bus.Request[*wrapperspb.StringValue](ctx, caller, "echo", wrapperspb.String("hi"))
	if err != nil || r.GetValue() != "echo: hi" {
		t.Fatalf("Request: %v, %v; want echo: hi", r, err)
	}
	if ct := contentType.Load(); ct != "application/protobuf" {
		t.Errorf("content type %v, want application/protobuf", ct)
	}
	if h := trailHeader.Load(); h != "s1s2" {
		t.Errorf("header set by the send middleware: %q, want s1s2", h)
	}
	// The reply may come before the handler's middleware returns.
	want := "s1 send command, s2 send command, h1 before google.protobuf.StringValue, h2 before google.protobuf.StringValue, handler, h2 after, h1 after"
	eventually(t, 10*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if got := strings.Join(trail, ", "); got != want {
			return fmt.Errorf("order:\n got %s\nwant %s", got, want)
		}
		return nil
	})
}

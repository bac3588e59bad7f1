package otelomnibus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
	"github.com/omnibus-go/omnibus/otelomnibus"
)

func TestMain(m *testing.M) {
	if os.Getenv("OTEL_LOG") == "" {
		slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	}
	goleak.VerifyTestMain(m)
}

// handling is what a handler saw of one attempt.
type handling struct {
	span        trace.SpanContext // the handler context's span
	traceparent string
	attempt     int
}

// systems are the messaging.system each transport's spans name.
var systems = map[string]string{"membus": "membus", "kafka": "kafka", "rabbitmq": "rabbitmq", "nats": "nats"}

// A message published inside a traced request continues that trace in
// the consumer, on every transport: the handler's span is the child of
// the producer span, which is the child of the request's span; both
// follow the messaging conventions (kinds, names, attributes), the
// consumer span links to the producer span, a failed attempt is an error
// span and its retry a new child. A message published without a trace
// context (by a client without the hook) starts a trace of its own, not
// one under a span the Subscribe context carries.
func TestTraceContinuesAcrossTransports(t *testing.T) {
	for _, tr := range observetest.Transports {
		t.Run(tr.Name, func(t *testing.T) {
			ns := observetest.Namespace()
			raw := tr.URL(t, ns)
			topic, group := ns+".orders", ns+"-billing"
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			defer tp.Shutdown(context.Background())
			hook, err := otelomnibus.New(otelomnibus.WithTracerProvider(tp))
			if err != nil {
				t.Fatal(err)
			}
			c := observetest.Open(t, raw, omnibus.WithHooks(hook))
			plain := observetest.Open(t, raw) // publishes without the hook
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := c.CreateTopic(ctx, topic, 2); err != nil {
				t.Fatal(err)
			}

			var mu sync.Mutex
			seen := map[string][]handling{}
			start := omnibus.StartLatest // the group's queue is made now, before the publishes
			if c.Capabilities().Replay {
				start = omnibus.StartEarliest
			}
			// The Subscribe context carries a span: handlings must not
			// become its children.
			sctx, ambient := tp.Tracer("test").Start(ctx, "subscriber setup")
			k, err := c.Subscribe(sctx, topic, func(ctx context.Context, m *omnibus.Message) error {
				mu.Lock()
				seen[m.ID] = append(seen[m.ID], handling{trace.SpanContextFromContext(ctx), m.Headers["traceparent"], m.Attempt})
				mu.Unlock()
				if string(m.Body) == "fail once" && m.Attempt == 1 {
					return errors.New("card declined")
				}
				return nil
			}, omnibus.Group(group), omnibus.StartFrom(start), omnibus.Backoff(10*time.Millisecond, 10*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			ambient.End()
			defer k.Close()

			rctx, request := tp.Tracer("test").Start(ctx, "POST /orders")
			traced := []*omnibus.Message{{Key: "order-1", Body: []byte("ok")}, {Key: "order-2", Body: []byte("fail once")}}
			for _, m := range traced { // one Publish each: each its own producer span
				if err := c.Publish(rctx, topic, m); err != nil {
					t.Fatal(err)
				}
			}
			request.End()
			untraced := &omnibus.Message{Key: "order-3", Body: []byte("ok")}
			if err := plain.Publish(ctx, topic, untraced); err != nil {
				t.Fatal(err)
			}
			go k.Run(ctx)
			observetest.Eventually(t, 30*time.Second, func() error {
				mu.Lock()
				defer mu.Unlock()
				if n := len(seen[traced[0].ID]) + len(seen[traced[1].ID]) + len(seen[untraced.ID]); n < 4 {
					return fmt.Errorf("%d handlings, want 4 (one message twice)", n)
				}
				return nil
			})
			if err := k.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}

			spans := rec.Ended()
			system := systems[tr.Name]
			for i, m := range traced {
				producer := findSpan(t, spans, "publish "+topic, m.ID)
				if producer.SpanKind() != trace.SpanKindProducer || producer.Parent().SpanID() != request.SpanContext().SpanID() ||
					producer.SpanContext().TraceID() != request.SpanContext().TraceID() {
					t.Errorf("message %d: producer span kind %v parent %v, want a producer span, child of the request %v",
						i, producer.SpanKind(), producer.Parent().SpanID(), request.SpanContext().SpanID())
				}
				wantAttrs(t, producer, map[attribute.Key]any{
					"messaging.system": system, "messaging.destination.name": topic, "messaging.operation.type": "send",
					"messaging.operation.name": "publish", "messaging.message.id": m.ID, "messaging.message.body.size": int64(len(m.Body)),
				})
				mu.Lock()
				hs := seen[m.ID]
				mu.Unlock()
				wantParent := fmt.Sprintf("00-%s-%s-01", producer.SpanContext().TraceID(), producer.SpanContext().SpanID())
				consumers := findSpans(spans, "process "+topic, m.ID)
				if len(consumers) != len(hs) || len(hs) != i+1 {
					t.Fatalf("message %d: %d consumer spans, %d handlings; want %d of each", i, len(consumers), len(hs), i+1)
				}
				for j, s := range consumers {
					h := hs[j]
					if h.traceparent != wantParent {
						t.Errorf("message %d: the handler saw traceparent %q, want the producer span's %q", i, h.traceparent, wantParent)
					}
					if s.SpanKind() != trace.SpanKindConsumer || s.Parent().SpanID() != producer.SpanContext().SpanID() ||
						s.SpanContext().TraceID() != request.SpanContext().TraceID() || !s.Parent().IsRemote() {
						t.Errorf("message %d attempt %d: consumer span kind %v parent %v, want a consumer span, child of the producer span %v in the request's trace",
							i, j+1, s.SpanKind(), s.Parent(), producer.SpanContext().SpanID())
					}
					if s.SpanContext().SpanID() != h.span.SpanID() {
						t.Errorf("message %d attempt %d: the handler's context holds span %v, want the consumer span %v", i, j+1, h.span.SpanID(), s.SpanContext().SpanID())
					}
					if len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != producer.SpanContext().SpanID() {
						t.Errorf("message %d attempt %d: links %v, want one, to the producer span", i, j+1, s.Links())
					}
					wantAttrs(t, s, map[attribute.Key]any{
						"messaging.system": system, "messaging.destination.name": topic, "messaging.operation.type": "process",
						"messaging.operation.name": "process", "messaging.message.id": m.ID, "messaging.consumer.group.name": group,
						"messaging.destination.partition.id": nonEmpty{}, "omnibus.message.attempt": int64(h.attempt),
					})
					failed := string(m.Body) == "fail once" && h.attempt == 1
					if failed != (s.Status().Code == codes.Error) {
						t.Errorf("message %q attempt %d: status %v", m.Body, h.attempt, s.Status())
					}
					if failed {
						wantAttrs(t, s, map[attribute.Key]any{"error.type": nonEmpty{}})
					}
				}
			}
			// The untraced message: a root of its own.
			for _, s := range findSpans(spans, "process "+topic, untraced.ID) {
				if s.Parent().IsValid() || s.SpanContext().TraceID() == ambient.SpanContext().TraceID() || len(s.Links()) != 0 {
					t.Errorf("untraced message: consumer span parent %v links %v, want a new root without links", s.Parent(), s.Links())
				}
			}
			if n := len(findSpans(spans, "process "+topic, untraced.ID)); n != 1 {
				t.Errorf("untraced message: %d consumer spans, want 1", n)
			}
		})
	}
}

// nonEmpty in wantAttrs asks for any value but the empty string.
type nonEmpty struct{}

func wantAttrs[K ~string](t *testing.T, s sdktrace.ReadOnlySpan, want map[K]any) {
	t.Helper()
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		got[kv.Key] = kv.Value
	}
	for k, w := range want {
		v, ok := got[attribute.Key(k)]
		switch {
		case !ok:
			t.Errorf("span %q: no attribute %s (has %v)", s.Name(), k, s.Attributes())
		case w == nonEmpty{}:
			if v.String() == "" {
				t.Errorf("span %q: %s is empty", s.Name(), k)
			}
		case v.AsInterface() != w:
			t.Errorf("span %q: %s = %v, want %v", s.Name(), k, v.AsInterface(), w)
		}
	}
}

// findSpans returns the spans named name about message id, in the order
// they started.
func findSpans(spans []sdktrace.ReadOnlySpan, name, id string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() != name {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "messaging.message.id" && kv.Value.AsString() == id {
				out = append(out, s)
			}
		}
	}
	slices.SortFunc(out, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	return out
}

func findSpan(t *testing.T, spans []sdktrace.ReadOnlySpan, name, id string) sdktrace.ReadOnlySpan {
	t.Helper()
	found := findSpans(spans, name, id)
	if len(found) != 1 {
		t.Fatalf("%d spans %q for message %s, want 1", len(found), name, id)
	}
	return found[0]
}

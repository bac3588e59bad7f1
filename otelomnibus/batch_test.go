package otelomnibus_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/observe/observetest"
	"github.com/omnibus-go/omnibus/otelomnibus"
)

// A message that already carries a trace context (forwarded, or given
// one by its producer) keeps it: the producer span links to it instead
// of replacing it. A batch handling starts a trace of its own, linked to
// every message's creation context; a Publish of several messages is one
// producer span whose context all of them carry.
func TestCreationContextsAndBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	hook, err := otelomnibus.New(otelomnibus.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	c := observetest.Open(t, "mem://"+observetest.Namespace()+"?partitions=1", omnibus.WithHooks(hook))

	octx, origin := tp.Tracer("test").Start(ctx, "origin")
	origin.End()
	forwarded := map[string]string{"tenant": "acme"}
	propagation.TraceContext{}.Inject(octx, propagation.MapCarrier(forwarded))
	shared := map[string]string{"tenant": "acme"} // one map for two messages: must not be written
	msgs := []*omnibus.Message{{Body: []byte("a"), Headers: forwarded}, {Body: []byte("b"), Headers: shared}, {Body: []byte("c"), Headers: shared}}
	wantForwarded := forwarded["traceparent"]
	if err := c.Publish(ctx, "batch", msgs...); err != nil {
		t.Fatal(err)
	}
	if msgs[0].Headers["traceparent"] != wantForwarded {
		t.Errorf("a message's own trace context was replaced: %q, want %q", msgs[0].Headers["traceparent"], wantForwarded)
	}
	if _, ok := shared["traceparent"]; ok {
		t.Errorf("the caller's shared header map was written: %v", shared)
	}
	if msgs[1].Headers["traceparent"] == "" || msgs[1].Headers["traceparent"] != msgs[2].Headers["traceparent"] || msgs[1].Headers["tenant"] != "acme" {
		t.Errorf("messages of one Publish carry %q and %q, want the producer span's context in both, headers kept", msgs[1].Headers, msgs[2].Headers)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want origin and one producer span", len(spans))
	}
	producer := spans[1]
	wantAttrs(t, producer, map[string]any{"messaging.batch.message_count": int64(3)})
	if len(producer.Links()) != 1 || producer.Links()[0].SpanContext.SpanID() != origin.SpanContext().SpanID() {
		t.Errorf("producer span links %v, want one, to the forwarded message's context", producer.Links())
	}

	got := make(chan trace.SpanContext, 1)
	k, err := c.SubscribeBatch(ctx, "batch", func(ctx context.Context, ms []*omnibus.Message) error {
		if len(ms) == 3 {
			got <- trace.SpanContextFromContext(ctx)
		}
		return nil
	}, omnibus.Batch(3, 1<<20, time.Second), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatal(err)
	}
	go k.Run(ctx)
	handler := <-got
	if err := k.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	var process sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "process batch" {
			process = s
		}
	}
	if process == nil || process.SpanContext().SpanID() != handler.SpanID() {
		t.Fatalf("no consumer span that the batch handler's context holds")
	}
	if process.Parent().IsValid() || process.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("batch span parent %v kind %v, want a root consumer span", process.Parent(), process.SpanKind())
	}
	linked := map[trace.SpanID]int{}
	for _, l := range process.Links() {
		linked[l.SpanContext.SpanID()]++
	}
	if len(process.Links()) != 3 || linked[origin.SpanContext().SpanID()] != 1 || linked[producer.SpanContext().SpanID()] != 2 {
		t.Errorf("batch span links %v, want the forwarded origin once and the producer span twice", process.Links())
	}
	wantAttrs(t, process, map[string]any{"messaging.batch.message_count": int64(3), "messaging.destination.partition.id": "0"})
}

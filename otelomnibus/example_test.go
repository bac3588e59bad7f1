package otelomnibus_test

import (
	"context"
	"fmt"
	"slices"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/otelomnibus"
)

// A message published inside a request's span is handled in a span of
// the same trace, a child of the producer span.
func Example() {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder() // in a program: an exporter's span processor
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(ctx)

	hook, err := otelomnibus.New(otelomnibus.WithTracerProvider(tp))
	if err != nil {
		panic(err)
	}
	defer hook.Close()
	c, err := omnibus.Open(ctx, "mem://example-otel", omnibus.WithHooks(hook))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	done := make(chan struct{})
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		close(done)
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		panic(err)
	}
	go k.Run(ctx)

	rctx, request := tp.Tracer("shop").Start(ctx, "POST /orders")
	if err := c.Publish(rctx, "orders", &omnibus.Message{Body: []byte("order 1")}); err != nil {
		panic(err)
	}
	request.End()
	<-done
	if err := k.Shutdown(ctx); err != nil {
		panic(err)
	}

	ended := spans.Ended()
	slices.SortFunc(ended, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	byID := map[string]string{}
	for _, s := range ended {
		byID[s.SpanContext().SpanID().String()] = s.Name()
	}
	for _, s := range ended {
		fmt.Printf("%-16s %-9v parent %q, same trace: %v\n", s.Name(), s.SpanKind(), byID[s.Parent().SpanID().String()],
			s.SpanContext().TraceID() == request.SpanContext().TraceID())
	}
	// Output:
	// POST /orders     internal  parent "", same trace: true
	// publish orders   producer  parent "POST /orders", same trace: true
	// process orders   consumer  parent "publish orders", same trace: true
}

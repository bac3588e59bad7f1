package otelomnibus

// Spans: a producer span per Publish, a consumer span per handling, and
// the trace context carried in the messages' headers between them.

import (
	"context"
	"maps"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/omnibus-go/omnibus"
)

// Operation names (messaging.operation.name) and the attribute of a
// delivery's attempt.
const (
	opPublish = "publish"
	opProcess = "process"
	// AttemptKey is the delivery attempt of a handled message (1 for the
	// first), omnibus's own attribute.
	AttemptKey = attribute.Key("omnibus.message.attempt")
)

// OnPublish starts the producer span of a Publish and injects its
// context into every message that carries none yet (a message that has
// one keeps it, and the span links to it).
func (p publishHook) OnPublish(ctx context.Context, topic string, msgs []*omnibus.Message) (context.Context, func(error)) {
	attrs := append(p.base[:len(p.base):len(p.base)],
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName(opPublish),
		semconv.MessagingDestinationName(topic))
	attrs = p.messageAttrs(attrs, msgs)
	var links []trace.Link
	for _, m := range msgs {
		if sc := p.creation(m); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	start := time.Now()
	ctx, span := p.tracer.Start(ctx, opPublish+" "+topic,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	if len(links) < len(msgs) {
		carrier := propagation.MapCarrier{}
		p.propagator.Inject(ctx, carrier)
		for _, m := range msgs {
			if !p.creation(m).IsValid() {
				// A copy: the caller's map may be shared by other
				// messages or other goroutines.
				h := maps.Clone(m.Headers)
				if h == nil {
					h = make(map[string]string, len(carrier))
				}
				maps.Copy(h, carrier)
				m.Headers = h
			}
		}
	}
	return ctx, func(err error) {
		p.inst.published(ctx, p.bound, topic, len(msgs), time.Since(start), err)
		end(span, err)
	}
}

// OnHandle starts the consumer span of a handling. For one message the
// span continues the message's trace (its creation context is the
// parent) and links to it; a batch's span starts a trace of its own and
// links to each message's creation context. A message without a trace
// context starts a trace of its own, never one under a span the
// Subscribe context happened to carry.
func (c consumerHook) OnHandle(ctx context.Context, topic string, msgs []*omnibus.Message) (context.Context, func(error)) {
	attrs := append(c.base[:len(c.base):len(c.base)],
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName(opProcess))
	attrs = c.messageAttrs(attrs, msgs)
	lane := ""
	if len(msgs) > 0 {
		lane = msgs[0].Lane
		for _, m := range msgs[1:] {
			if m.Lane != lane {
				lane = ""
				break
			}
		}
	}
	if lane != "" {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(lane))
	}
	if len(msgs) == 1 {
		attrs = append(attrs, AttemptKey.Int(msgs[0].Attempt))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	parent := ctx
	if len(msgs) == 1 {
		if pctx := c.propagator.Extract(ctx, propagation.MapCarrier(msgs[0].Headers)); trace.SpanContextFromContext(pctx).IsRemote() {
			parent = pctx
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: trace.SpanContextFromContext(pctx)}))
		} else {
			opts = append(opts, trace.WithNewRoot())
		}
	} else {
		var links []trace.Link
		for _, m := range msgs {
			if sc := c.creation(m); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(links...))
	}
	start := time.Now()
	ctx, span := c.tracer.Start(parent, opProcess+" "+topic, opts...)
	return ctx, func(err error) {
		c.inst.processed(ctx, c.bound, lane, len(msgs), time.Since(start), err)
		end(span, err)
	}
}

// messageAttrs adds the attributes of one message (its ID, body size,
// and the Kafka key) or of a batch (its count).
func (b *bound) messageAttrs(attrs []attribute.KeyValue, msgs []*omnibus.Message) []attribute.KeyValue {
	if len(msgs) != 1 {
		return append(attrs, semconv.MessagingBatchMessageCount(len(msgs)))
	}
	m := msgs[0]
	attrs = append(attrs, semconv.MessagingMessageID(m.ID), semconv.MessagingMessageBodySize(len(m.Body)))
	if b.system == "kafka" {
		if m.Key != "" {
			attrs = append(attrs, semconv.MessagingKafkaMessageKey(m.Key))
		}
		if off, err := strconv.Atoi(m.Position); err == nil {
			attrs = append(attrs, semconv.MessagingKafkaOffset(off))
		}
	}
	return attrs
}

// creation is the creation context a message carries, if any.
func (b *bound) creation(m *omnibus.Message) trace.SpanContext {
	if len(m.Headers) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(b.propagator.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
}

// end ends a span with the outcome err: an error sets the status and
// error.type and records the error.
func end(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorType(err))
		span.RecordError(err)
	}
	span.End()
}

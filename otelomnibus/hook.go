package otelomnibus

// The Hook: options, binding to a client or a consumer, and the names
// of messaging systems.

import (
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/observe"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/omnibus-go/omnibus/otelomnibus"

// Hook traces and measures omnibus. Register it on a client with
// omnibus.WithHooks (every publish and every consumer), or on one
// consumer with omnibus.Hooks. One Hook may serve any number of clients
// and consumers. Create it with New.
type Hook struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	inst       instruments
	consumers  observe.Consumers[[]attribute.KeyValue] // with their base attributes
	gauges     metric.Registration                     // the callback that observes the gauges
}

// Option configures a Hook.
type Option func(*config)

type config struct {
	tp   trace.TracerProvider
	mp   metric.MeterProvider
	prop propagation.TextMapPropagator
}

// WithTracerProvider sets where spans go. Default:
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets where metrics go. Default:
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithPropagator sets how a span's context travels in a message's
// headers. Default: propagation.TraceContext{}, the W3C traceparent and
// tracestate that the CloudEvents distributed-tracing extension names
// (pass otel.GetTextMapPropagator() to carry baggage too).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// New returns a Hook. It fails only when the meter provider refuses an
// instrument.
func New(opts ...Option) (*Hook, error) {
	cfg := config{prop: propagation.TraceContext{}}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	h := &Hook{
		tracer:     cfg.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		propagator: cfg.prop,
	}
	meter := cfg.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	if err := h.inst.init(meter); err != nil {
		return nil, fmt.Errorf("otelomnibus: %w", err)
	}
	reg, err := meter.RegisterCallback(h.observe, h.inst.observables()...)
	if err != nil {
		return nil, fmt.Errorf("otelomnibus: %w", err)
	}
	h.gauges = reg
	return h, nil
}

// Close stops observing the gauges (members, in flight, lag) of the
// consumers h was bound to, for a meter provider that outlives h. Spans
// and counters need no closing.
func (h *Hook) Close() error {
	return h.gauges.Unregister()
}

// BindHook binds h to a client's publishes or to a consumer (see
// omnibus.HookBinder); the engine calls it.
func (h *Hook) BindHook(s omnibus.HookScope) omnibus.Hook {
	b := &bound{Hook: h, system: System(s.Transport)}
	b.base = []attribute.KeyValue{semconv.MessagingSystemKey.String(b.system)}
	if k := s.Consumer; k != nil {
		b.topic, b.group = k.Topic(), k.Group()
		b.base = append(b.base, semconv.MessagingDestinationName(b.topic), semconv.MessagingConsumerGroupName(b.group))
		h.consumers.Add(k, b.base)
		return consumerHook{b}
	}
	return publishHook{b}
}

// bound is a Hook bound to a client or to one consumer.
type bound struct {
	*Hook
	system       string
	topic, group string               // a consumer's; empty for a client
	base         []attribute.KeyValue // messaging.system, and a consumer's destination and group
	lanes        sync.Map             // lane -> attribute.Set: a consumer's per-lane metric attributes
}

// publishHook is what a client runs: publishes only.
type publishHook struct{ *bound }

// consumerHook is what a consumer runs: handlings and the engine's
// events.
type consumerHook struct{ *bound }

// systems are the messaging.system values of transport names (URL
// schemes and package names) where OpenTelemetry names the system.
var systems = map[string]string{
	"kafka": "kafka", "kafkas": "kafka", "kafkabus": "kafka",
	"amqp": "rabbitmq", "amqps": "rabbitmq", "rabbitbus": "rabbitmq",
	"nats": "nats", "natsbus": "nats",
	"mem": "membus", "membus": "membus",
	"redis": "redis", "rediss": "redis", "redisbus": "redis",
	"nsq": "nsq", "nsqbus": "nsq",
	"kinesis": "aws_kinesis", "kinesisbus": "aws_kinesis",
}

// System is the messaging.system of a transport name (omnibus.HookScope's
// Transport): kafka, rabbitmq, nats, membus, redis, nsq, aws_kinesis, or
// the name itself for a transport not listed.
func System(transport string) string {
	if s, ok := systems[transport]; ok {
		return s
	}
	return transport
}

package otelomnibus

// Metrics: the messaging semantic conventions' client metrics, omnibus's
// counters of the engine's events, and gauges read from the consumers
// at collection time.

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/observe"
)

// LaneChangeKey says what happened to a lane in omnibus.consumer.lane_changes:
// claimed, revoked or lost.
const LaneChangeKey = attribute.Key("omnibus.lane.change")

type instruments struct {
	sent         metric.Int64Counter     // messaging.client.sent.messages
	sendDuration metric.Float64Histogram // messaging.client.operation.duration
	consumed     metric.Int64Counter     // messaging.client.consumed.messages
	process      metric.Float64Histogram // messaging.process.duration
	retries      metric.Int64Counter
	deadLetters  metric.Int64Counter
	dlFailures   metric.Int64Counter
	laneChanges  metric.Int64Counter
	inFlight     metric.Int64ObservableGauge
	members      metric.Int64ObservableGauge
	lag          metric.Int64ObservableGauge
	timeLag      metric.Float64ObservableGauge
}

func (in *instruments) init(m metric.Meter) error {
	sent, err := messagingconv.NewClientSentMessages(m)
	if err != nil {
		return err
	}
	sendDuration, err := messagingconv.NewClientOperationDuration(m)
	if err != nil {
		return err
	}
	consumed, err := messagingconv.NewClientConsumedMessages(m)
	if err != nil {
		return err
	}
	process, err := messagingconv.NewProcessDuration(m)
	if err != nil {
		return err
	}
	in.sent, in.sendDuration, in.consumed, in.process = sent.Inst(), sendDuration.Inst(), consumed.Inst(), process.Inst()
	counters := []struct {
		to         *metric.Int64Counter
		name, unit string
		desc       string
	}{
		{&in.retries, "omnibus.consumer.retries", "{retry}", "Retries scheduled after a failed attempt."},
		{&in.deadLetters, "omnibus.consumer.dead_letters", "{message}", "Messages published to the dead-letter topic."},
		{&in.dlFailures, "omnibus.consumer.dead_letter_failures", "{attempt}", "Dead-letter publishes that failed (the message holds its key and is tried again)."},
		{&in.laneChanges, "omnibus.consumer.lane_changes", "{lane}", "Lanes claimed, revoked or lost by the consumer's members."},
	}
	for _, c := range counters {
		if *c.to, err = m.Int64Counter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc)); err != nil {
			return err
		}
	}
	if in.inFlight, err = m.Int64ObservableGauge("omnibus.consumer.in_flight", metric.WithUnit("{message}"),
		metric.WithDescription("Messages received and not settled, per lane.")); err != nil {
		return err
	}
	if in.members, err = m.Int64ObservableGauge("omnibus.consumer.members", metric.WithUnit("{member}"),
		metric.WithDescription("Group members the consumer runs in this process.")); err != nil {
		return err
	}
	if in.lag, err = m.Int64ObservableGauge("omnibus.consumer.lag", metric.WithUnit("{message}"),
		metric.WithDescription("The group's lag per lane in records or messages, as the transport counts it; no value when unknown.")); err != nil {
		return err
	}
	in.timeLag, err = m.Float64ObservableGauge("omnibus.consumer.time_lag", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unsettled message per lane, where the transport tells."))
	return err
}

func (in *instruments) observables() []metric.Observable {
	return []metric.Observable{in.inFlight, in.members, in.lag, in.timeLag}
}

// published records a Publish of n messages: those that landed, and
// those that failed with error.type.
func (in *instruments) published(ctx context.Context, b *bound, topic string, n int, took time.Duration, err error) {
	attrs := append(b.base[:len(b.base):len(b.base)], semconv.MessagingOperationName(opPublish),
		semconv.MessagingOperationTypeSend, semconv.MessagingDestinationName(topic))
	ok := metric.WithAttributes(attrs...)
	failed := 0
	if err != nil {
		failed = n
		var pe *omnibus.PublishError
		if errors.As(err, &pe) {
			failed = len(pe.Failed)
		}
		bad := metric.WithAttributes(append(attrs, semconv.ErrorType(err))...)
		in.sent.Add(ctx, int64(failed), bad)
		in.sendDuration.Record(ctx, took.Seconds(), bad)
	} else {
		in.sendDuration.Record(ctx, took.Seconds(), ok)
	}
	if n > failed {
		in.sent.Add(ctx, int64(n-failed), ok)
	}
}

// processed records a handling of n messages of lane ("" for a batch
// across lanes).
func (in *instruments) processed(ctx context.Context, b *bound, lane string, n int, took time.Duration, err error) {
	set := b.laneSet(lane)
	if err != nil {
		attrs := append(set.ToSlice(), semconv.ErrorType(err))
		set = attribute.NewSet(attrs...)
	}
	opt := metric.WithAttributeSet(set)
	in.consumed.Add(ctx, int64(n), opt)
	in.process.Record(ctx, took.Seconds(), opt)
}

// laneSet is a consumer's metric attributes for lane, made once per lane.
func (b *bound) laneSet(lane string) attribute.Set {
	if s, ok := b.lanes.Load(lane); ok {
		return s.(attribute.Set)
	}
	attrs := append(b.base[:len(b.base):len(b.base)], semconv.MessagingOperationName(opProcess), semconv.MessagingOperationTypeProcess)
	if lane != "" {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(lane))
	}
	s, _ := b.lanes.LoadOrStore(lane, attribute.NewSet(attrs...))
	return s.(attribute.Set)
}

// OnRetry counts a retry.
func (c consumerHook) OnRetry(e omnibus.Event) {
	c.inst.retries.Add(context.Background(), 1, metric.WithAttributeSet(c.laneSet(e.Lane)))
}

// OnDeadLetter counts a dead letter, or a failure to publish one.
func (c consumerHook) OnDeadLetter(e omnibus.Event) {
	to := c.inst.deadLetters
	if e.Kind == omnibus.EventDeadLetterFailed {
		to = c.inst.dlFailures
	}
	to.Add(context.Background(), 1, metric.WithAttributeSet(c.laneSet(e.Lane)))
}

// OnLanes counts lane claims, revocations and losses.
func (c consumerHook) OnLanes(e omnibus.Event) {
	attrs := append(c.base[:len(c.base):len(c.base)], LaneChangeKey.String(e.Kind.String()))
	c.inst.laneChanges.Add(context.Background(), int64(len(e.Lanes)), metric.WithAttributes(attrs...))
}

// observe reports the gauges of every consumer the hook was bound to and
// that still runs: members, in flight and lag per lane.
func (h *Hook) observe(ctx context.Context, o metric.Observer) error {
	for _, r := range observe.Read(ctx, h.consumers.Live()) {
		base := r.Value
		o.ObserveInt64(h.inst.members, int64(r.Stats.Members), metric.WithAttributes(base...))
		for _, l := range r.Stats.Lanes {
			if l.Member >= 0 {
				o.ObserveInt64(h.inst.inFlight, int64(l.InFlight), laneAttrs(base, l.Lane))
			}
		}
		for _, l := range r.Lanes {
			if l.MessagesKnown {
				o.ObserveInt64(h.inst.lag, l.Messages, laneAttrs(base, l.Lane))
			}
			if l.SecondsKnown {
				o.ObserveFloat64(h.inst.timeLag, l.Seconds, laneAttrs(base, l.Lane))
			}
		}
	}
	return nil
}

func laneAttrs(base []attribute.KeyValue, lane string) metric.ObserveOption {
	return metric.WithAttributes(append(base[:len(base):len(base)], semconv.MessagingDestinationPartitionID(lane))...)
}

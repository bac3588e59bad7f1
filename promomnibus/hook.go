package promomnibus

// The hook side: what the engine's calls and events add to the
// Collector's counters, with every label set resolved once per topic or
// lane, so a message costs atomic adds and no allocation.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnibus-go/omnibus"
)

// BindHook binds c to a client's publishes or to a consumer (see
// omnibus.HookBinder); the engine calls it.
func (c *Collector) BindHook(s omnibus.HookScope) omnibus.Hook {
	if k := s.Consumer; k != nil {
		labels := []string{s.Transport, k.Topic(), k.Group()}
		c.consumers.Add(k, labels)
		return &consumerHook{c: c, labels: labels,
			received: c.received.WithLabelValues(labels...), receivedBytes: c.receivedBytes.WithLabelValues(labels...),
			handleTime: c.handleTime.WithLabelValues(labels...)}
	}
	return &publishHook{c: c, transport: s.Transport}
}

// publishHook counts a client's publishes.
type publishHook struct {
	c         *Collector
	transport string
	topics    sync.Map // topic -> *topicMetrics
}

type topicMetrics struct {
	published, failed prometheus.Counter
	took              prometheus.Observer
}

func (p *publishHook) topic(topic string) *topicMetrics {
	if t, ok := p.topics.Load(topic); ok {
		return t.(*topicMetrics)
	}
	t, _ := p.topics.LoadOrStore(topic, &topicMetrics{
		published: p.c.published.WithLabelValues(p.transport, topic),
		failed:    p.c.publishFailed.WithLabelValues(p.transport, topic),
		took:      p.c.publishTime.WithLabelValues(p.transport, topic),
	})
	return t.(*topicMetrics)
}

// OnPublish counts the messages of a Publish that landed and those that
// failed, and times the call.
func (p *publishHook) OnPublish(ctx context.Context, topic string, msgs []*omnibus.Message) (context.Context, func(error)) {
	start := time.Now()
	return ctx, func(err error) {
		t := p.topic(topic)
		t.took.Observe(time.Since(start).Seconds())
		failed := 0
		if err != nil {
			failed = len(msgs)
			var pe *omnibus.PublishError
			if errors.As(err, &pe) {
				failed = len(pe.Failed)
			}
		}
		t.published.Add(float64(len(msgs) - failed))
		t.failed.Add(float64(failed))
	}
}

// consumerHook counts what a consumer's engine does.
type consumerHook struct {
	c                       *Collector
	labels                  []string // transport, topic, group
	received, receivedBytes prometheus.Counter
	handleTime              prometheus.Observer
	lanes                   sync.Map // lane -> *laneMetrics
}

type laneMetrics struct {
	handled, errors, retries, deadLetters, deadLetterFail prometheus.Counter
}

func (k *consumerHook) lane(lane string) *laneMetrics {
	if l, ok := k.lanes.Load(lane); ok {
		return l.(*laneMetrics)
	}
	labels := append(k.labels[:3:3], lane)
	l, _ := k.lanes.LoadOrStore(lane, &laneMetrics{
		handled:        k.c.handled.WithLabelValues(labels...),
		errors:         k.c.handlerErrors.WithLabelValues(labels...),
		retries:        k.c.retries.WithLabelValues(labels...),
		deadLetters:    k.c.deadLetters.WithLabelValues(labels...),
		deadLetterFail: k.c.deadLetterFail.WithLabelValues(labels...),
	})
	return l.(*laneMetrics)
}

// OnFetch counts what the transport delivered.
func (k *consumerHook) OnFetch(info omnibus.FetchInfo) {
	k.received.Add(float64(info.Count))
	k.receivedBytes.Add(float64(info.Bytes))
}

// OnSettle counts a handled message, failed or not, and times it.
func (k *consumerHook) OnSettle(e omnibus.Event) {
	l := k.lane(e.Lane)
	l.handled.Inc()
	if e.Kind == omnibus.EventFailed {
		l.errors.Inc()
	}
	k.handleTime.Observe(e.Latency.Seconds())
}

// OnRetry counts a retry.
func (k *consumerHook) OnRetry(e omnibus.Event) { k.lane(e.Lane).retries.Inc() }

// OnDeadLetter counts a dead letter, or a failure to publish one.
func (k *consumerHook) OnDeadLetter(e omnibus.Event) {
	if e.Kind == omnibus.EventDeadLetterFailed {
		k.lane(e.Lane).deadLetterFail.Inc()
		return
	}
	k.lane(e.Lane).deadLetters.Inc()
}

// OnLanes counts lane claims, revocations and losses.
func (k *consumerHook) OnLanes(e omnibus.Event) {
	k.c.laneChanges.WithLabelValues(k.labels[0], k.labels[1], k.labels[2], e.Kind.String()).Add(float64(len(e.Lanes)))
}

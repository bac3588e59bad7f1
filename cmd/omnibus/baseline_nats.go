package main

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
)

func init() {
	baselines[natsbus.Scheme] = baseline{client: "nats.go/jetstream", run: natsBaseline}
}

// natsBaseline does bench's work with nats.go's jetstream package: a
// durable pull consumer acknowledging each message while a producer
// publishes asynchronously. On the embedded URL it starts an embedded
// server of its own (the client's is private to it).
func natsBaseline(ctx context.Context, _ *omnibus.Client, rawURL, _ string, o benchOptions) (pubRate, conRate float64, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, 0, err
	}
	server := *u
	server.RawQuery = ""
	if u.Host == natsbus.EmbeddedHost {
		srv, err := natsbus.StartServer(ctx, natsbus.ServerConfig{})
		if err != nil {
			return 0, 0, err
		}
		defer srv.Close()
		server = url.URL{Scheme: "nats", Host: srv.NATSServer().Addr().String()}
	}
	nc, err := nats.Connect(server.String(), nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return 0, 0, fmt.Errorf("connect %s: %w", server.Redacted(), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natsbus.DefaultPublishWindow))
	if err != nil {
		return 0, 0, err
	}
	id := shortID()
	stream, subject := "omnibus_rawbench_"+id, "omnibus.rawbench."+id
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		return 0, 0, fmt.Errorf("create stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 256})
	if err != nil {
		return 0, 0, fmt.Errorf("create consumer: %w", err)
	}
	var received atomic.Int64
	var last atomic.Int64
	done := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		last.Store(time.Now().UnixNano())
		if received.Add(1) == int64(o.count) {
			close(done)
		}
	})
	if err != nil {
		return 0, 0, fmt.Errorf("consume: %w", err)
	}
	defer cc.Stop()

	body := generatedBody(0, o.size)
	t0 := time.Now()
	for range o.count {
		if _, err := js.PublishAsync(subject, body); err != nil {
			return 0, 0, fmt.Errorf("publish: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	pubDur := time.Since(t0)
	timer := time.NewTimer(o.timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-timer.C:
		return 0, 0, fmt.Errorf("consumed %d of %d messages in %v", received.Load(), o.count, o.timeout)
	}
	return rate(o.count, pubDur), rate(o.count, time.Unix(0, last.Load()).Sub(t0)), nil
}

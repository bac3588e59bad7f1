package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
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

// natsBaseline does bench's work with nats.go's jetstream package, as
// natsbus does it: the same headers (message ID for the server's duplicate
// window, CloudEvents attributes, the send time), published in batches of
// --batch that each wait for their acks, while durable pull consumers
// acknowledge each message with the window natsbus gives the default
// MaxInFlight. On a partitioned URL it publishes to --lanes partition
// subjects by key and reads each with a consumer of its own, as natsbus's
// partitioned mode does (without the leases). On the embedded URL it
// starts an embedded server of its own (the client's is private to it).
// It deletes its stream, with the consumers, when done.
func natsBaseline(ctx context.Context, _ *omnibus.Client, rawURL, _ string, o benchOptions, left *leftovers) (pubRate, conRate float64, err error) {
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
		return 0, 0, fmt.Errorf("connect %s: %w", omnibus.RedactURL(server.String()), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natsbus.DefaultPublishWindow))
	if err != nil {
		return 0, 0, err
	}
	id := shortID()
	stream, subject := "omnibus_rawbench_"+id, "omnibus.rawbench."+id
	subjects := []string{subject}
	if u.Query().Get("partitions") != "" {
		subjects = subjects[:0]
		for p := range o.lanes {
			subjects = append(subjects, subject+"."+strconv.Itoa(p))
		}
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: subjects, Duplicates: natsbus.DefaultDupeWindow}); err != nil {
		return 0, 0, fmt.Errorf("create stream: %w", err)
	}
	defer left.remove(ctx, "stream "+stream, func(ctx context.Context) error { return js.DeleteStream(ctx, stream) })

	const window = 256 // omnibus.MaxInFlight's default
	var received, last atomic.Int64
	var lat latencies
	done := make(chan struct{})
	for i, s := range subjects {
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
			Durable: "raw" + strconv.Itoa(i), FilterSubject: s, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 16 * window})
		if err != nil {
			return 0, 0, fmt.Errorf("create consumer: %w", err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			now := time.Now()
			_, _ = m.Metadata() // natsbus reads the delivery count from it
			lat.add(now, m.Headers().Get(headerSent))
			_ = m.Ack()
			last.Store(now.UnixNano())
			if received.Add(1) == int64(o.count) {
				close(done)
			}
		}, jetstream.PullMaxMessages(window))
		if err != nil {
			return 0, 0, fmt.Errorf("consume: %w", err)
		}
		defer cc.Stop()
	}

	body := generatedBody(0, o.size)
	futures := make([]jetstream.PubAckFuture, 0, o.batch)
	t0 := time.Now()
	for i := 0; i < o.count; i += o.batch {
		futures = futures[:0]
		sent := strconv.FormatInt(time.Now().UnixNano(), 10)
		for j := i; j < min(o.count, i+o.batch); j++ {
			key := "k" + strconv.Itoa(j%64)
			s := subjects[0]
			if len(subjects) > 1 {
				s = subjects[natsbus.Partition(key, len(subjects))]
			}
			id := omnibus.NewID()
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: s, Data: body, Header: nats.Header{
				jetstream.MsgIDHeader:      {id},
				natsbus.HeaderID:           {id},
				natsbus.HeaderSpecVersion:  {"1.0"},
				natsbus.HeaderTime:         {time.Now().UTC().Format(time.RFC3339Nano)},
				natsbus.HeaderPartitionKey: {key},
				headerSent:                 {sent},
			}})
			if err != nil {
				return 0, 0, fmt.Errorf("publish: %w", err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return 0, 0, fmt.Errorf("publish: %w", err)
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			}
		}
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

package kafkabus_test

// Interoperability with the CloudEvents SDK for Go (its sarama binding),
// both ways, on kfake. The SDK is a test dependency only.

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafka_sarama "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/cetest"
	"github.com/omnibus-go/omnibus/transporttest"
)

func saramaConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	// sarama's requests of later versions fail against kfake with
	// "invalid byteslice length"; 2.1 has record headers, which is all
	// binary content mode needs.
	cfg.Version = sarama.V2_1_0_0
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Group.Rebalance.Timeout = 5 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 100 * time.Millisecond
	return cfg
}

// receiveOne subscribes to topic from its start and returns the first
// message delivered.
func receiveOne(t *testing.T, c *omnibus.Client, topic string) *omnibus.Message {
	t.Helper()
	var mu sync.Mutex
	var got *omnibus.Message
	k, err := c.Subscribe(ctxT(t), topic, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if got == nil {
			cp := *m
			cp.Body = bytes.Clone(m.Body)
			got = &cp
		}
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	stop := run(t, k)
	transporttest.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return got != nil },
		func() string { return "omnibus received nothing" })
	stop()
	return got
}

func TestCloudEventsSDK(t *testing.T) {
	cluster := newCluster(t, kfake.SeedTopics(4, "to-sdk", "from-sdk"))
	brokers := cluster.ListenAddrs()
	c := open(t, clusterURL(cluster, ""))

	t.Run("SDK reads omnibus", func(t *testing.T) {
		want := cetest.Message()
		if err := c.Publish(ctxT(t), "to-sdk", want); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		consumer, err := kafka_sarama.NewConsumer(brokers, saramaConfig(), "sdk-reader", "to-sdk")
		if err != nil {
			t.Fatalf("SDK consumer: %v", err)
		}
		defer func() { _ = consumer.Close(context.Background()) }()
		client, err := cloudevents.NewClient(consumer)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		events := make(chan cloudevents.Event, 1)
		done := make(chan error, 1)
		go func() {
			done <- client.StartReceiver(ctx, func(e cloudevents.Event) {
				select {
				case events <- e:
				default:
				}
			})
		}()
		select {
		case e := <-events:
			cetest.CheckEvent(t, e, want)
		case err := <-done:
			t.Fatalf("SDK receiver ended before an event: %v", err)
		case <-ctx.Done():
			t.Fatal("SDK received no event in 60s (a record it cannot decode is dropped with a log line)")
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("SDK receiver: %v", err)
		}
	})

	t.Run("omnibus reads SDK", func(t *testing.T) {
		want := cetest.Message()
		delete(want.Headers, "trace-id")
		sender, err := kafka_sarama.NewSender(brokers, saramaConfig(), "from-sdk")
		if err != nil {
			t.Fatalf("SDK sender: %v", err)
		}
		defer func() { _ = sender.Close(context.Background()) }()
		client, err := cloudevents.NewClient(sender)
		if err != nil {
			t.Fatal(err)
		}
		if res := client.Send(ctxT(t), cetest.Event(t, want)); !cloudevents.IsACK(res) {
			t.Fatalf("SDK send: %v", res)
		}
		cetest.CheckDelivered(t, receiveOne(t, c, "from-sdk"), want)
	})
}

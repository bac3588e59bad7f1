package kafkabus_test

// Interoperability with the CloudEvents SDK for Go (its sarama binding),
// both ways, on kfake. The SDK is a test dependency only.

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafka_sarama "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/twmb/franz-go/pkg/kfake"

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

func TestCloudEventsSDK(t *testing.T) {
	cluster := newCluster(t, kfake.SeedTopics(4, "to-sdk", "from-sdk-binary", "from-sdk-structured"))
	brokers := cluster.ListenAddrs()
	c := transporttest.Open(t, clusterURL(cluster, ""))

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
		cetest.CheckEvent(t, cetest.Receive(t, consumer, 60*time.Second), want)
	})

	// The SDK sends in binary content mode unless told otherwise.
	for name, ctx := range map[string]context.Context{
		"binary":     context.Background(),
		"structured": binding.WithForceStructured(context.Background()),
	} {
		t.Run("omnibus reads SDK "+name, func(t *testing.T) {
			want := cetest.Message()
			topic := "from-sdk-" + name
			sender, err := kafka_sarama.NewSender(brokers, saramaConfig(), topic)
			if err != nil {
				t.Fatalf("SDK sender: %v", err)
			}
			defer func() { _ = sender.Close(context.Background()) }()
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			cetest.Send(ctx, t, sender, want)
			cetest.CheckDelivered(t, cetest.Deliver(ctx, t, c, topic), want)
		})
	}
}

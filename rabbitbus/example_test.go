package rabbitbus_test

import (
	"context"
	"log"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/rabbitbus"
)

// Open a client on RabbitMQ and publish a message with publisher confirms.
func Example() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "amqp://guest:guest@localhost:5672/?queue_type=quorum")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Publish(ctx, "orders", &omnibus.Message{
		Key:  "customer-42",
		Type: "order.created",
		Body: []byte(`{"order":1}`),
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Partitioned mode: per-key order while the group's members share lanes.
func Example_partitioned() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "amqp://guest:guest@localhost:5672/?partitions=8")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		log.Printf("%s %s", m.Key, m.Body)
		return nil
	}, omnibus.Group("billing"), omnibus.Order(omnibus.OrderKey))
	if err != nil {
		log.Fatal(err)
	}
	_ = k.Run(ctx)
}

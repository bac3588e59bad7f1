package redisbus_test

import (
	"context"
	"log"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/redisbus"
)

// Open a client on Redis and publish a message; WAIT for the replicas
// (durability all is the default).
func Example() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "redis://:password@localhost:6379/0?maxlen=1000000")
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

// Partitioned mode: per-key order while the group's members share the
// lanes through fenced leases.
func Example_partitioned() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "redis://localhost:6379?partitions=8&lease_ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		log.Printf("%s %s (attempt %d)", m.Key, m.Body, m.Attempt)
		return nil
	}, omnibus.Group("billing"), omnibus.Order(omnibus.OrderKey))
	if err != nil {
		log.Fatal(err)
	}
	_ = k.Run(ctx)
}

package kinesisbus_test

import (
	"context"
	"log"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/kinesisbus"
)

// A group reading a Kinesis stream: the lease table "orders.billing" in
// DynamoDB holds its leases and checkpoints, in the KCL's schema.
func Example() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "kinesis://us-east-1") // credentials from the SDK's default chain
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		log.Printf("order %s for %s from shard %s", m.ID, m.Key, m.Lane)
		return nil
	}, omnibus.Group("billing"))
	if err != nil {
		log.Fatal(err)
	}
	if err := k.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Moving a Java KCL application's group to omnibus: name its lease table,
// and omnibus goes on from its checkpoints once its workers have stopped.
func Example_kclTable() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "kinesis://eu-west-1?lease_table=OrdersProcessor")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error { return nil },
		omnibus.Group("OrdersProcessor"))
	if err != nil {
		log.Fatal(err)
	}
	_ = k.Run(ctx)
}

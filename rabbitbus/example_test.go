package rabbitbus_test

import (
	"context"
	"crypto/tls"
	"log"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/rabbitbus"
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

// Log in with a client certificate (SASL EXTERNAL; the server needs the
// rabbitmq_auth_mechanism_ssl plugin) by configuring the transport in
// Go: the TLS configuration and amqp091-go's configuration are values a
// URL cannot carry. The URL still names the server and sets the
// parameters.
func ExampleNew() {
	cert, err := tls.LoadX509KeyPair("client.pem", "client-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	d := rabbitbus.New(
		rabbitbus.WithTLS(&tls.Config{Certificates: []tls.Certificate{cert}}),
		rabbitbus.WithConfig(amqp.Config{SASL: []amqp.Authentication{&amqp.ExternalAuth{}}}),
	)
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "amqps://rabbit.example.com:5671/?queue_type=quorum", omnibus.WithDriver(d))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Publish(ctx, "orders", &omnibus.Message{Key: "customer-42", Body: []byte(`{"order":1}`)})
	if err != nil {
		log.Fatal(err)
	}
}

package natsbus_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
)

// Open the embedded server (a NATS server with JetStream inside the
// process, storing in dir) and publish a message.
func Example_embedded() {
	dir, err := os.MkdirTemp("", "omnibus-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	c, err := omnibus.Open(ctx, natsbus.EmbeddedURL(dir)) // nats://embedded?dir=...
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	m := &omnibus.Message{Type: "order.created", Key: "order-42", Body: []byte(`{"total":12}`)}
	if err := c.Publish(ctx, "orders", m); err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", m.Type, "to orders; ordered lanes:", c.Capabilities().Ordered)
	// Output: published order.created to orders; ordered lanes: false
}

// Hand natsbus a connection of your own, made with whatever nats.go
// options you need (here plain; in production a JWT signer, a custom
// dialer, handlers). natsbus uses it and leaves it open; the URL names
// the server for errors and logs. natsbus.New also takes WithTLS and
// WithOptions for a connection natsbus dials itself.
func ExampleWithConn() {
	srv, err := natsbus.StartServer(context.Background(), natsbus.ServerConfig{}) // a server in a temporary directory
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	nc, err := nats.Connect(srv.URL(), nats.Name("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	ctx := context.Background()
	d := natsbus.New(natsbus.WithConn(nc))
	c, err := omnibus.Open(ctx, srv.URL(), omnibus.WithDriver(d))
	if err != nil {
		log.Fatal(err)
	}
	err = c.Publish(ctx, "invoices", &omnibus.Message{Key: "customer-7", Body: []byte(`{"total":30}`)})
	fmt.Println("published:", err == nil)
	_ = c.Close()
	fmt.Println("connection still open:", nc.IsConnected())
	// Output:
	// published: true
	// connection still open: true
}

package natsbus_test

import (
	"context"
	"fmt"
	"log"
	"os"

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

package nsqbus_test

import (
	"context"
	"log"
	"time"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/nsqbus"
)

// Open a client on an nsqd and publish a batch (one MPUB) that nsqd
// has stored when Publish returns.
func Example() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "nsq://127.0.0.1:4150")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	err = c.Publish(ctx, "orders",
		&omnibus.Message{Type: "order.created", Body: []byte(`{"order":1}`), ContentType: "application/json"},
		&omnibus.Message{Type: "order.created", Body: []byte(`{"order":2}`), ContentType: "application/json"},
	)
	if err != nil {
		log.Fatal(err)
	}
}

// Consume through nsqlookupd: the group is a channel on every nsqd that
// holds the topic; a failed message comes back after the backoff (REQ
// with a delay), and handlers slower than msg_timeout keep their
// messages (TOUCH).
func Example_lookup() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "nsq://lookupd1:4161,lookupd2:4161?lookup=true&msg_timeout=30s")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		log.Printf("%s attempt %d: %s", m.ID, m.Attempt, m.Body)
		return nil
	}, omnibus.Group("billing"), omnibus.MaxAttempts(5), omnibus.Backoff(time.Second, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	_ = k.Run(ctx)
}

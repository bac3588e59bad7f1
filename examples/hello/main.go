package main

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/natsbus" // registers nats://, with an embedded server
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) // Ctrl-C ends Run
	defer stop()
	c, err := omnibus.Open(ctx, "nats://embedded") // a NATS server inside the process
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateTopic(ctx, "orders", 4); err != nil { // Kafka creates no topic on first use
		log.Fatal(err)
	}

	// Subscribe before publishing: a new group starts after the last message
	// (StartFrom(StartEarliest) starts it at the first, where the transport can replay).
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		log.Printf("order %s for %s: %s", m.ID, m.Key, m.Body)
		return nil // nil settles; an error retries; omnibus.Permanent(err) dead-letters
	}, omnibus.Group("billing"))
	if err != nil {
		log.Fatal(err)
	}

	err = c.Publish(ctx, "orders", &omnibus.Message{Key: "customer-7", Body: []byte(`{"total":42}`)})
	if err != nil {
		log.Fatal(err)
	}
	if err := k.Run(ctx); err != nil { // until Ctrl-C; then drains and commits
		log.Fatal(err)
	}
}

// Command bus runs three services of a shop in one process, on the
// embedded NATS server: orders places orders and asks billing to charge
// them (Request), billing charges the card, replies and publishes
// PaymentCaptured, and shipping ships what was paid. Each service has a
// client of its own, as separate processes would.
//
//	go run ./examples/bus
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	_ "github.com/omnibus-go/omnibus/natsbus" // registers nats://, with an embedded server
)

// The shop's messages. MessageKey keeps each order's messages in order.
type (
	OrderPlaced struct {
		Order string
		Total int
	}
	ChargeCard struct {
		Order  string
		Amount int
	}
	Charged         struct{ Order, Receipt string }
	PaymentCaptured struct{ Order string }
)

func (m OrderPlaced) MessageKey() string     { return m.Order }
func (m ChargeCard) MessageKey() string      { return m.Order }
func (m PaymentCaptured) MessageKey() string { return m.Order }

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	shipped := make(chan string)

	billing := service(ctx, "billing", func(b *bus.Bus) error {
		return bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, c ChargeCard) error {
			if c.Amount > 1000 {
				// Permanent: no retry; the command goes to the dead-letter
				// topic and the requester gets a fault.
				return omnibus.Permanent(fmt.Errorf("card declined: %d over the limit", c.Amount))
			}
			if err := inv.Reply(ctx, Charged{Order: c.Order, Receipt: "r-" + c.Order}); err != nil {
				return err // an error retries the command
			}
			return b.Publish(ctx, PaymentCaptured{Order: c.Order}) // ctx: caused by the command
		})
	})
	shipping := service(ctx, "shipping", func(b *bus.Bus) error {
		if err := bus.HandleEvent(b, "orders", func(ctx context.Context, inv bus.Invocation, e OrderPlaced) error {
			log.Printf("shipping: %s placed, preparing the parcel", e.Order)
			return nil
		}); err != nil {
			return err
		}
		return bus.HandleEvent(b, "billing", func(ctx context.Context, inv bus.Invocation, e PaymentCaptured) error {
			log.Printf("shipping: %s paid, shipping it (conversation %s)", e.Order, inv.CorrelationID())
			select {
			case shipped <- e.Order:
			case <-ctx.Done():
			}
			return nil
		})
	})
	orders := service(ctx, "orders", nil)
	defer stop(billing, shipping, orders)

	// Order IDs unique to this run: the services' groups outlive it, in
	// the embedded server's data directory.
	run := time.Now().Format("150405")
	paid := map[string]bool{}
	for i, total := range []int{40, 2500, 75} {
		order := fmt.Sprintf("o-%s-%d", run, i+1)
		if err := orders.Publish(ctx, OrderPlaced{Order: order, Total: total}); err != nil {
			log.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a Request needs a deadline
		charged, err := bus.Request[Charged](rctx, orders, "billing", ChargeCard{Order: order, Amount: total})
		cancel()
		var fault *bus.FaultError
		switch {
		case errors.As(err, &fault):
			log.Printf("orders: %s declined by %s: %s", order, fault.Service, fault.Reason)
		case err != nil:
			log.Fatal(err)
		default:
			log.Printf("orders: %s charged, receipt %s", order, charged.Receipt)
			paid[order] = true
		}
	}
	for n := 0; n < len(paid); {
		select {
		case order := <-shipped:
			if paid[order] {
				n++
			}
		case <-ctx.Done():
			log.Fatalf("%d of %d paid orders shipped: %v", n, len(paid), ctx.Err())
		}
	}
	log.Printf("done: %d of 3 orders shipped", len(paid))
}

// service starts an instance of a service, with the handlers register
// adds, on a client of its own.
func service(ctx context.Context, name string, register func(*bus.Bus) error) *bus.Bus {
	c, err := omnibus.Open(ctx, "nats://embedded") // a NATS server inside the process
	if err != nil {
		log.Fatal(err)
	}
	b, err := bus.New(c, name)
	if err != nil {
		log.Fatal(err)
	}
	if register != nil {
		if err := register(b); err != nil {
			log.Fatal(err)
		}
	}
	if err := b.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return b
}

// stop shuts the services down, then their clients.
func stop(bs ...*bus.Bus) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range bs {
		if err := b.Shutdown(ctx); err != nil {
			log.Print(err)
		}
		_ = b.Client().Close()
	}
}

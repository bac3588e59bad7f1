package bus_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/bus"
	"github.com/omnibus-go/omnibus/natsbus"
)

// The example's messages.
type (
	Charge  struct{ Order string }
	Receipt struct{ Order, Number string }
	Paid    struct{ Order, Receipt string }
)

// Three services in one process, on an embedded NATS server: orders
// asks billing to charge an order and waits for the receipt; billing
// replies and publishes Paid; shipping subscribes to billing's events.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "bus-example")
	check(err)
	defer os.RemoveAll(dir)

	// One client per service, as separate processes would have.
	instance := func(service string) *bus.Bus {
		c, err := omnibus.Open(ctx, natsbus.EmbeddedURL(dir))
		check(err)
		b, err := bus.New(c, service)
		check(err)
		return b
	}
	billing, shipping, orders := instance("billing"), instance("shipping"), instance("orders")

	check(bus.HandleCommand(billing, func(ctx context.Context, inv bus.Invocation, c Charge) error {
		if err := inv.Reply(ctx, Receipt{Order: c.Order, Number: "r-1"}); err != nil {
			return err
		}
		return billing.Publish(ctx, Paid{Order: c.Order, Receipt: "r-1"})
	}))
	paid := make(chan string, 1)
	check(bus.HandleEvent(shipping, "billing", func(ctx context.Context, inv bus.Invocation, e Paid) error {
		paid <- e.Order
		return nil
	}))
	for _, b := range []*bus.Bus{billing, shipping, orders} {
		check(b.Start(ctx))
		defer func() {
			_ = b.Shutdown(ctx)
			_ = b.Client().Close()
		}()
	}

	r, err := bus.Request[Receipt](ctx, orders, "billing", Charge{Order: "o-1"}) // ctx has a deadline
	check(err)
	fmt.Println("orders got receipt", r.Number, "for", r.Order)
	fmt.Println("shipping saw", <-paid, "paid")
	// Output:
	// orders got receipt r-1 for o-1
	// shipping saw o-1 paid
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

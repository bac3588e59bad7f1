package dlq_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/dlq"
	_ "github.com/omnibus-go/omnibus/membus"
)

// A consumer gives up on an order; the dead letter is listed with why,
// then replayed to its topic, where the consumer handles it.
func Example() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "mem://example-dlq")
	if err != nil {
		panic(err)
	}
	defer c.Close()

	dead, handled := make(chan struct{}, 1), make(chan string, 1)
	k, err := c.Subscribe(ctx, "orders", func(_ context.Context, m *omnibus.Message) error {
		if m.Headers[dlq.HeaderReplays] == "" {
			return omnibus.Permanent(errors.New("card declined"))
		}
		handled <- m.ID
		return nil
	}, omnibus.Group("billing"), omnibus.Observe(func(e omnibus.Event) {
		if e.Kind == omnibus.EventDeadLettered {
			dead <- struct{}{}
		}
	}))
	if err != nil {
		panic(err)
	}
	defer k.Close()
	go k.Run(ctx)
	if err := c.Publish(ctx, "orders", &omnibus.Message{ID: "o-2", Body: []byte(`{"order":2}`)}); err != nil {
		panic(err)
	}
	<-dead

	q, err := dlq.New(c, "orders.dlq")
	if err != nil {
		panic(err)
	}
	l, err := q.List(ctx, dlq.ListOptions{})
	if err != nil {
		panic(err)
	}
	for _, d := range l.DeadLetters {
		fmt.Printf("%s failed %d time(s) in %s: %s\n", d.ID, d.Attempts, d.OriginGroup, d.Reason)
	}
	p, err := q.Replay(ctx, dlq.ReplayOptions{Filter: dlq.Filter{IDs: []string{"o-2"}}})
	if err != nil {
		panic(err)
	}
	fmt.Println("replayed", p.Replayed, "as", <-handled)
	// Output:
	// o-2 failed 1 time(s) in billing: card declined
	// replayed 1 as o-2-r1
}

package omnibus_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"github.com/omnibus-go/omnibus"
	_ "github.com/omnibus-go/omnibus/membus"
)

// Open a transport by URL and publish. A blank import of the transport's
// package registers its scheme.
func Example_openFromURL() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "mem://example-open?partitions=4")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	m := &omnibus.Message{Key: "customer-7", Type: "order.created", Body: []byte(`{"order":1}`)}
	if err := c.Publish(ctx, "orders", m); err != nil {
		log.Fatal(err)
	}
	fmt.Println("published with an ID:", m.ID != "")
	// Output: published with an ID: true
}

// Subscribe a consumer group and run a handler until the work is done.
func ExampleClient_Subscribe() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "mem://example-subscribe")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	k, err := c.Subscribe(ctx, "orders", func(ctx context.Context, m *omnibus.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(m.Body))
		if len(got) == 3 {
			close(done)
		}
		return nil
	}, omnibus.Group("billing"), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		log.Fatal(err)
	}
	for _, body := range []string{"a", "b", "c"} {
		if err := c.Publish(ctx, "orders", &omnibus.Message{Key: "customer-7", Body: []byte(body)}); err != nil {
			log.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	go func() { <-done; stop() }()
	if err := k.Run(runCtx); err != nil { // drains and commits when runCtx ends
		log.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(got) // one key: handled in order
	// Output: [a b c]
}

// A batch handler receives slices of messages, flushed on count, bytes or
// time, and can fail single messages of the batch.
func ExampleClient_SubscribeBatch() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "mem://example-batch?partitions=1")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	k, err := c.SubscribeBatch(ctx, "events", func(ctx context.Context, ms []*omnibus.Message) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			seen = append(seen, string(m.Body))
		}
		if len(seen) == 3 {
			close(done)
		}
		return nil
	}, omnibus.Batch(100, 1<<20, 10*time.Millisecond), omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		log.Fatal(err)
	}
	var ms []*omnibus.Message
	for _, b := range []string{"x", "y", "z"} {
		ms = append(ms, &omnibus.Message{Body: []byte(b)})
	}
	if err := c.Publish(ctx, "events", ms...); err != nil {
		log.Fatal(err)
	}
	go k.Run(ctx)
	<-done
	if err := k.Shutdown(ctx); err != nil {
		log.Fatal(err)
	}
	slices.Sort(seen)
	fmt.Println(seen)
	// Output: [x y z]
}

// Publish asynchronously: one goroutine keeps many messages in flight,
// coalesced into batches; each result says whether its message landed.
func ExampleClient_Publisher() {
	ctx := context.Background()
	c, err := omnibus.Open(ctx, "mem://example-publisher")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	p, err := c.Publisher(omnibus.Linger(time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	var results []*omnibus.PublishResult
	for i := range 1000 {
		r, err := p.Publish(ctx, "orders", &omnibus.Message{Key: fmt.Sprint("customer-", i%10), Body: []byte("{}")})
		if err != nil {
			log.Fatal(err) // not queued: invalid, closed, or out of room
		}
		results = append(results, r)
	}
	if err := p.Close(ctx); err != nil { // publishes what it holds, then waits
		log.Fatal(err)
	}
	failed := 0
	for _, r := range results {
		if r.Err() != nil {
			failed++
		}
	}
	fmt.Println("failed:", failed)
	// Output: failed: 0
}

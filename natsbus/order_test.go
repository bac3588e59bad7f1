package natsbus_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestPublishOrderAcrossRestart publishes a few keys concurrently, one
// goroutine per key numbering its messages, in batches of several
// messages of the key, while the server restarts three times; the
// publishes ride through. Then it reads the stream in order and checks
// that every message is there once and that no message of a key is
// stored after one of the same key with a higher number.
func TestPublishOrderAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): restart test")
	}
	srv := startPrivateServer(t)
	// A small publish window makes each call wait for acks while it
	// sends, so the restarts fall inside calls: a call sends part of its
	// batch on the old connection and the rest after the drop.
	pub := transporttest.Open(t, srv.url()+"?reconnect_wait=50ms&publish_window=10")
	const (
		topic    = "order-restart"
		keys     = 4
		batch    = 100
		restarts = 3
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := pub.Publish(ctx, topic, &omnibus.Message{ID: "first", Key: "setup"}); err != nil {
		t.Fatal(err)
	}

	var (
		stop      atomic.Bool
		published atomic.Int64
		wg        sync.WaitGroup
		errs      = make(chan error, keys)
		sent      = make([]int, keys) // messages of each key that landed
	)
	body := []byte(strings.Repeat("o", 200))
	for k := 0; k < keys; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "key-" + strconv.Itoa(k)
			for n := 0; !stop.Load(); {
				ms := make([]*omnibus.Message, batch)
				for j := range ms {
					ms[j] = &omnibus.Message{ID: fmt.Sprintf("%s/%06d", key, n+j), Key: key, Body: body}
				}
				// Without a deadline of its own, Publish rides through the
				// restart: what failed is published again, same IDs.
				if err := pub.Publish(ctx, topic, ms...); err != nil {
					errs <- fmt.Errorf("publish %s %d..%d: %w", key, n, n+batch-1, err)
					return
				}
				n += batch
				sent[k] = n
				published.Add(batch)
			}
		}()
	}
	for r := 0; r < restarts; r++ {
		at := published.Load() + 3000
		for published.Load() < at && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		srv.stop()
		time.Sleep(200 * time.Millisecond)
		srv.start()
	}
	at := published.Load() + 2000
	for published.Load() < at && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, n := range sent {
		total += n
	}

	// Read the stream in order.
	nc, err := nats.Connect(srv.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	cons, err := js.OrderedConsumer(rctx, natsbus.StreamName(topic), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(rctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := int(info.NumPending)
	var (
		last     = map[string]int{} // key: highest number seen
		seen     = map[string]int{}
		inverted []string
	)
	for read := 0; read < stored; {
		b, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			read++
			id := m.Headers().Get(jetstream.MsgIDHeader)
			seen[id]++
			key, num, ok := strings.Cut(id, "/")
			if !ok {
				continue
			}
			n, _ := strconv.Atoi(num)
			if hi, ok := last[key]; ok && n < hi {
				inverted = append(inverted, fmt.Sprintf("%s after %s/%06d", id, key, hi))
			} else {
				last[key] = n
			}
		}
		if err := b.Error(); err != nil {
			t.Fatal(err)
		}
	}
	var missing []string
	for k, n := range sent {
		for i := 0; i < n; i++ {
			if id := fmt.Sprintf("key-%d/%06d", k, i); seen[id] == 0 {
				missing = append(missing, id)
			}
		}
	}
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d messages of %d keys published across %d restarts; %d stored, %d stored twice, %d out of order",
		total, keys, restarts, stored, dups, len(inverted))
	if len(missing) > 0 {
		t.Errorf("%d of %d published messages are not in the stream, first %v", len(missing), total, missing[:min(5, len(missing))])
	}
	if dups > 0 {
		t.Errorf("%d messages stored twice (the duplicate window should drop them)", dups)
	}
	if len(inverted) > 0 {
		t.Errorf("%d messages stored after a later message of their key, first %v", len(inverted), inverted[:min(5, len(inverted))])
	}
}

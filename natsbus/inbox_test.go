package natsbus

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// TestInboxOrderAndBounds moves items from several pumps through the
// inbox with takes of random sizes: every item arrives once, in its
// pump's order, and the inbox never holds more than its bound.
func TestInboxOrderAndBounds(t *testing.T) {
	const pumps, each = 4, 5000
	q := newInbox()
	stop := make(chan struct{})
	readers := make([]*reader, pumps)
	var wg sync.WaitGroup
	for p := range readers {
		r := &reader{}
		readers[p] = r
		wg.Go(func() {
			for i := range each {
				// err carries the sequence: items need no real message.
				if !q.put(item{r: r, err: seq(i)}, stop) {
					t.Error("put stopped")
					return
				}
			}
		})
	}
	next := map[*reader]int{}
	var buf []item
	for got := 0; got < pumps*each; {
		buf = q.take(buf[:0], 1+rand.IntN(100))
		if len(buf) == 0 {
			select {
			case <-q.ready:
			case <-time.After(5 * time.Second):
				t.Fatalf("no item for 5s after %d of %d", got, pumps*each)
			}
			continue
		}
		for _, it := range buf {
			if want := next[it.r]; int(it.err.(seq)) != want {
				t.Fatalf("pump item %d arrived, want %d", it.err.(seq), want)
			}
			next[it.r]++
		}
		got += len(buf)
		q.mu.Lock()
		if len(q.items) > inboxLen {
			t.Fatalf("inbox holds %d, bound %d", len(q.items), inboxLen)
		}
		q.mu.Unlock()
	}
	wg.Wait()
	close(stop)
}

type seq int

func (s seq) Error() string { return "item" }

// TestReceiveSkipsLanesGivenUp fills the inbox with items of a stopped
// reader, with a live reader's item behind them: Receive passes over the
// dead items and returns the live one rather than wait for more.
func TestReceiveSkipsLanesGivenUp(t *testing.T) {
	s := newSub(&conn{}, "orders", nil, driver.SubscribeOptions{MaxInFlight: 4})
	dead, live := &reader{lane: "0"}, &reader{lane: "1"}
	dead.stopped.Store(true)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for range inboxLen + 10 {
			s.inbox.put(item{r: dead, err: errors.New("stale")}, stop)
		}
		s.inbox.put(item{r: live, err: errors.New("live lane failed")}, stop)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		ds, err := s.Receive(ctx, driver.Room{Count: 4, Bytes: 1 << 20})
		if err != nil {
			if ctx.Err() != nil {
				t.Fatal("Receive waited with the live lane's item in the inbox")
			}
			return // the live lane's item, and nothing of the dead one
		}
		if len(ds) > 0 {
			t.Fatalf("Receive returned %d deliveries of a stopped reader", len(ds))
		}
	}
}

// A read error taken together with deliveries loses neither: Receive
// returns the deliveries, and the error with the next call.
func TestReceiveKeepsErrorForNextCall(t *testing.T) {
	s := newSub(&conn{}, "orders", nil, driver.SubscribeOptions{MaxInFlight: 4})
	r := &reader{lane: "0"}
	delivery := func(id string) *held {
		h := &held{r: r}
		h.d = driver.Delivery{Message: driver.Message{ID: id}, Lane: r.lane, Token: h}
		return h
	}
	failed := errors.New("pull failed")
	for _, it := range []item{{r: r, h: delivery("m1")}, {r: r, err: failed}, {r: r, h: delivery("m2")}} {
		s.inbox.put(it, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ds, err := s.Receive(ctx, driver.Room{Count: 10, Bytes: 1 << 20})
	if err != nil || len(ds) != 2 || ds[0].ID != "m1" || ds[1].ID != "m2" {
		t.Fatalf("first Receive = %d deliveries, %v; want m1 and m2", len(ds), err)
	}
	if _, err := s.Receive(ctx, driver.Room{Count: 10, Bytes: 1 << 20}); !errors.Is(err, failed) {
		t.Fatalf("second Receive: %v, want the read error", err)
	}
}

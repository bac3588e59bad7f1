package rabbitbus

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/transporttest"
)

// readyCount reads how many messages of queue q are ready (neither held
// by a consumer nor acknowledged).
func readyCount(t testing.TB, q string) int {
	t.Helper()
	ac, ch := rawChannel(t)
	defer ac.Close()
	info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("reading queue %s: %v", q, err)
	}
	return info.Messages
}

// Closing a member hands back at once everything it received and did not
// acknowledge, including what the server pushed into its buffer and the
// engine never took: the queue has it ready again as soon as Close
// returns, while the member's client stays open.
func TestCloseHandsBackUnsettled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := open(ctx, t, "")
	topic := "omnibus-handback-" + strings.ToLower(omnibus.NewID())
	queue := groupQueue(topic, "g")
	lanes := &slowLanes{claimed: map[string]bool{}, revoking: make(chan string, 8), release: make(chan struct{})}
	close(lanes.release)
	const prefetch, n = 100, 300
	sub, err := c.Driver().(*conn).Subscribe(ctx, topic, driver.SubscribeOptions{Group: "g", MaxInFlight: prefetch, MaxInFlightBytes: 1 << 20, Lanes: lanes})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = sub.Close()
		}
	}()
	ms := make([]*omnibus.Message, n)
	for i := range ms {
		ms[i] = &omnibus.Message{ID: "h-" + strconv.Itoa(i), Body: []byte("x")}
	}
	if err := c.Publish(ctx, topic, ms...); err != nil {
		t.Fatal(err)
	}
	// The server pushes its prefetch; the member takes 10 and settles 4.
	transporttest.Eventually(t, 30*time.Second, func() bool { return readyCount(t, queue) == n-prefetch }, func() string {
		return fmt.Sprintf("%d ready, want %d once the member holds its prefetch", readyCount(t, queue), n-prefetch)
	})
	ds, err := sub.Receive(ctx, driver.Room{Count: 10, Bytes: 1 << 20})
	if err != nil || len(ds) != 10 {
		t.Fatalf("Receive = %d deliveries, %v; want 10", len(ds), err)
	}
	if err := sub.(driver.Acker).Ack(ctx, ds[:4]); err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	// Everything else is back at once, the client still open: 6 taken and
	// not settled, 90 in the buffer.
	want := n - 4
	transporttest.Eventually(t, 2*time.Second, func() bool { return readyCount(t, queue) == want }, func() string {
		return fmt.Sprintf("%d ready after Close, want %d (all but the 4 acknowledged)", readyCount(t, queue), want)
	})
}

// Two members share a group; one shuts down (or closes) mid-stream. What
// it had received and not settled goes to the other at once: every
// message is handled, soon after, with the member's client still open.
func TestShutdownMidStreamHandsBack(t *testing.T) {
	for _, stop := range []string{"Shutdown", "Close"} {
		t.Run(stop, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ca, cb := open(ctx, t, ""), open(ctx, t, "")
			topic := "omnibus-midstream-" + strings.ToLower(omnibus.NewID())
			var mu sync.Mutex
			handled := map[string]int{}
			byA := 0
			handler := func(a bool) omnibus.Handler {
				return func(ctx context.Context, m *omnibus.Message) error {
					select {
					case <-time.After(5 * time.Millisecond):
					case <-ctx.Done():
						return ctx.Err()
					}
					mu.Lock()
					defer mu.Unlock()
					handled[m.ID]++
					if a {
						byA++
					}
					return nil
				}
			}
			opts := []omnibus.SubscribeOption{omnibus.Group("g"), omnibus.Order(omnibus.OrderNone), omnibus.MaxInFlight(50)}
			ka, err := ca.Subscribe(ctx, topic, handler(true), opts...)
			if err != nil {
				t.Fatal(err)
			}
			kb, err := cb.Subscribe(ctx, topic, handler(false), opts...)
			if err != nil {
				t.Fatal(err)
			}
			actx, acancel := context.WithCancel(ctx)
			defer acancel()
			aDone := make(chan error, 1)
			go func() { aDone <- ka.Run(actx) }()
			transporttest.RunConsumer(t, kb)

			const n = 3000
			ids := make([]string, n)
			ms := make([]*omnibus.Message, n)
			for i := range ms {
				ids[i] = "m-" + strconv.Itoa(i)
				ms[i] = &omnibus.Message{ID: ids[i], Body: []byte("x")}
			}
			if err := ca.Publish(ctx, topic, ms...); err != nil {
				t.Fatal(err)
			}
			transporttest.Eventually(t, time.Minute, func() bool { mu.Lock(); defer mu.Unlock(); return byA >= 200 }, func() string { return "member A handled fewer than 200" })
			stopped := time.Now()
			if stop == "Shutdown" {
				sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
				err = ka.Shutdown(sctx)
				scancel()
			} else {
				err = ka.Close()
			}
			if err != nil {
				t.Errorf("%s: %v", stop, err)
			}
			took := time.Since(stopped)
			acancel()
			<-aDone
			missing := func() int {
				mu.Lock()
				defer mu.Unlock()
				miss := 0
				for _, id := range ids {
					if handled[id] == 0 {
						miss++
					}
				}
				return miss
			}
			// The other member alone handles the rest in about a second.
			transporttest.Eventually(t, 20*time.Second, func() bool { return missing() == 0 }, func() string {
				return fmt.Sprintf("%d of %d never handled after member A's %s (its client still open)", missing(), n, stop)
			})
			mu.Lock()
			defer mu.Unlock()
			dups := 0
			for _, c := range handled {
				dups += c - 1
			}
			t.Logf("%s took %v; A handled %d; all %d handled %v after it; %d duplicates", stop, took, byA, n, time.Since(stopped), dups)
		})
	}
}

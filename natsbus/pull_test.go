package natsbus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestPullNeverDropped: the engine is full (its handlers stalled) while
// the lanes' pulls wait half served, long enough for the server's idle
// heartbeats, and then a burst comes. A pull whose buffer has no room
// for its status messages besides the messages it asked for has the
// client drop one (a slow consumer): a partition's reader then misses a
// delivery and gives its lane up, and the member claims it again and
// reads again all it had not acknowledged; an unpartitioned group gets
// the message only after ack_wait. No message may be dropped by the
// client, no lane lost, nothing lost, and, on partitions, no message of
// a key handled for the first time after a newer one of its key was
// settled (an unpartitioned group's lane is unordered).
func TestPullNeverDropped(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): idle heartbeats take seconds")
	}
	for _, tt := range []struct {
		name   string
		params string
		parts  int
	}{
		{"Partitioned", partitionedParams, 2},
		{"Unpartitioned", "ack_wait=30s", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t, &server.Options{})
			base := "nats://" + s.Addr().String()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()

			var dropped atomic.Int64
			d := natsbus.New(natsbus.WithOptions(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrSlowConsumer) {
					dropped.Add(1)
				}
			})))
			pub := transporttest.Open(t, base+"?"+tt.params)
			c, err := omnibus.Open(ctx, base+"?"+tt.params, omnibus.WithDriver(d))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			topic := newTopic(ctx, t, pub, base, tt.parts)

			// Handlers wait while the gate is shut.
			var gateMu sync.Mutex
			gate := make(chan struct{})
			close(gate)
			shut := func() {
				gateMu.Lock()
				gate = make(chan struct{})
				gateMu.Unlock()
			}
			release := func() {
				gateMu.Lock()
				close(gate)
				gateMu.Unlock()
			}
			col := newOrderLog()
			handle := func(ctx context.Context, m *omnibus.Message) error {
				gateMu.Lock()
				g := gate
				gateMu.Unlock()
				select {
				case <-g:
				case <-ctx.Done():
					return ctx.Err()
				}
				col.record(m)
				return nil
			}
			var lost atomic.Int64
			k, err := c.Subscribe(ctx, topic, handle, omnibus.Group("g"), omnibus.MaxInFlight(16),
				omnibus.Observe(func(e omnibus.Event) {
					if e.Kind == omnibus.EventLost {
						lost.Add(int64(len(e.Lanes)))
					}
				}))
			if err != nil {
				t.Fatal(err)
			}
			transporttest.RunConsumer(t, k)
			holdsLanes(t, k, tt.parts)

			const keys = 8
			var sent []string
			n := 0
			publish := func(count int) {
				t.Helper()
				ms := make([]*omnibus.Message, count)
				for i := range ms {
					n++
					ms[i] = numbered(n, n%keys)
				}
				if err := pub.Publish(ctx, topic, ms...); err != nil {
					t.Fatalf("Publish: %v", err)
				}
				for _, m := range ms {
					sent = append(sent, m.ID)
				}
			}
			for cycle := range 4 {
				// A trickle the handlers keep up with: each lane's pull
				// is served a message at a time and asks for more while
				// the one before still waits half served.
				for range 20 {
					publish(2)
					time.Sleep(40 * time.Millisecond)
				}
				// The engine fills and stays full: the pumps block with
				// pulls still waiting on the server, which sends them
				// idle heartbeats; then a burst serves the pulls.
				shut()
				publish(100)
				time.Sleep(3 * time.Second)
				publish(60)
				time.Sleep(500 * time.Millisecond)
				release()
				eventually(t, 60*time.Second, func() error {
					if miss := col.missing(sent); len(miss) > 0 {
						return fmt.Errorf("cycle %d: %d of %d messages not handled yet, e.g. %v", cycle, len(miss), len(sent), miss[:min(5, len(miss))])
					}
					return nil
				})
			}
			calls, dups, replays, bad := col.result()
			t.Logf("%d published, %d handler calls, %d duplicates (%d after a newer message of the key), %d lanes lost, %d pulled messages dropped by the client (slow consumer episodes)",
				len(sent), calls, dups, replays, lost.Load(), dropped.Load())
			if dropped.Load() > 0 {
				t.Errorf("the client dropped pulled messages %d times (slow consumer)", dropped.Load())
			}
			if lost.Load() > 0 {
				t.Errorf("%d lanes lost; want none", lost.Load())
			}
			if tt.parts > 1 && len(bad) > 0 {
				t.Errorf("key order broken %d times, e.g.:\n\t%s", len(bad), strings.Join(bad[:min(10, len(bad))], "\n\t"))
			}
		})
	}
}

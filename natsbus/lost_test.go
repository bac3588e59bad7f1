package natsbus_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestLostLaneKeepsKeyOrder: a member reads the two partitions of a
// topic while messages of many keys are published steadily and handlers
// of varying speed let the reader pull ahead (MaxInFlight 64, ack_wait
// 1s). Then, nine times, it loses what it pulled, three ways in turn:
// the server denies the member's writes of its leases (a publish dropped
// unanswered), so that the lanes are lost at their deadline and claimed
// again once the leases expired; the leases are taken over, so that the
// lanes are lost at the next refresh and claimed again once the keys are
// deleted; a read fails (as on a missed heartbeat), which drops what the
// pull held. Nothing may be lost, and no message of a key may
// be handled for the first time after a newer one of its key was
// settled: a lost lane hands nothing more to the engine, and a lane
// claimed again starts at its first message not acknowledged, in order.
// Duplicates are allowed (at least once: what the engine handled but
// could not acknowledge before the loss comes again, in order, and may
// come after newer messages of its key that were handled as well).
func TestLostLaneKeepsKeyOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP (-short): lease losses")
	}
	addr, deny := permServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const (
		parts  = 2
		keys   = 24
		losses = 9 // of three kinds
	)
	params := "?" + partitionedParams + "&ack_wait=1s"
	pub := transporttest.Open(t, "nats://admin:pw@"+addr+params)
	c := transporttest.Open(t, "nats://member:pw@"+addr+params)
	topic := newTopic(ctx, t, pub, "nats://admin:pw@"+addr, parts)
	group := "lost"
	col := newOrderLog()
	var lost atomic.Int64
	k, err := c.Subscribe(ctx, topic, col.handle, omnibus.Group(group), omnibus.MaxInFlight(64),
		omnibus.Observe(func(e omnibus.Event) {
			if e.Kind == omnibus.EventLost {
				lost.Add(int64(len(e.Lanes)))
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	holdsLanes(t, k, parts)

	// Publish steadily until the losses are over: batches of messages of
	// every key, numbered in publish order.
	var (
		stop   atomic.Bool
		sent   []string
		wg     sync.WaitGroup
		pubErr error
	)
	wg.Go(func() {
		n := 0
		for !stop.Load() {
			ms := make([]*omnibus.Message, keys)
			for i := range ms {
				n++
				ms[i] = numbered(n, i)
			}
			if err := pub.Publish(ctx, topic, ms...); err != nil {
				pubErr = err
				return
			}
			for _, m := range ms {
				sent = append(sent, m.ID)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})

	bucket := natsbus.LeaseBucket(topic, group)
	kv, err := rawJetStream(t, "nats://admin:pw@"+addr).KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	for i := range losses {
		at := col.handled() + 200
		eventually(t, 20*time.Second, func() error {
			if got := owned(k); got != parts || col.handled() < at {
				return fmt.Errorf("loss %d: the member holds %d lanes and handled %d messages; want %d lanes and %d", i, got, col.handled(), parts, at)
			}
			return nil
		})
		switch i % 3 {
		case 0:
			// Writes dropped: the lanes are lost at their deadline, and
			// claimed again once the leases expired on the server.
			deny("$KV." + bucket + ".p.>")
		case 1:
			// Leases taken over: the lanes are lost at the next refresh,
			// and claimed again as soon as the keys are deleted.
			for p := range parts {
				if _, err := kv.Put(ctx, "p."+strconv.Itoa(p), []byte("intruder")); err != nil {
					t.Fatal(err)
				}
			}
		case 2:
			// A read fails (a missed heartbeat), dropping what the pull
			// held: the lane must not go on with newer messages.
			natsbus.FailNextRead()
			continue
		}
		eventually(t, 10*time.Second, func() error {
			if got := owned(k); got != 0 {
				return fmt.Errorf("loss %d: the member holds %d lanes, want 0", i, got)
			}
			return nil
		})
		if i%3 == 0 {
			deny()
		} else {
			for p := range parts {
				if err := kv.Delete(ctx, "p."+strconv.Itoa(p)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	holdsLanes(t, k, parts)
	stop.Store(true)
	wg.Wait()
	if pubErr != nil {
		t.Fatalf("Publish: %v", pubErr)
	}
	eventually(t, 30*time.Second, func() error {
		if miss := col.missing(sent); len(miss) > 0 {
			return fmt.Errorf("%d of %d messages never handled, e.g. %v", len(miss), len(sent), miss[:min(5, len(miss))])
		}
		return nil
	})
	calls, dups, replays, bad := col.result()
	t.Logf("%d published, %d handler calls, %d duplicates (%d after a newer message of the key), %d lanes lost, %d messages handled first after a newer one of the key",
		len(sent), calls, dups, replays, lost.Load(), len(bad))
	if want := int64(losses / 3 * 2 * parts); lost.Load() < want {
		t.Errorf("%d lanes lost; want at least %d (%d losses of %d lanes)", lost.Load(), want, losses/3*2, parts)
	}
	if len(bad) > 0 {
		t.Errorf("key order broken %d times (no message of a key may be handled for the first time after a newer one of its key was settled), e.g.:\n\t%s",
			len(bad), strings.Join(bad[:min(10, len(bad))], "\n\t"))
	}
}

// owned is how many lanes k holds (Stats lists lanes between owners too).
func owned(k *omnibus.Consumer) int {
	n := 0
	for _, l := range k.Stats().Lanes {
		if l.Member >= 0 {
			n++
		}
	}
	return n
}

// numbered is message n (its number in header n, which orderLog reads)
// of key "k<key>".
func numbered(n, key int) *omnibus.Message {
	return &omnibus.Message{
		ID:      fmt.Sprintf("m%06d", n),
		Key:     "k" + strconv.Itoa(key),
		Headers: map[string]string{"n": strconv.Itoa(n)},
		Body:    []byte("x"),
	}
}

// orderLog records what handlers settle and checks key order as it goes,
// as transporttest's collector does: a message of a key handled after a
// newer one of its key was settled breaks it, a redelivery included.
type orderLog struct {
	mu      sync.Mutex
	seen    map[string]int
	calls   int
	newest  map[string]int    // per key: the highest number settled
	at      map[string]string // per key: the position of that one
	bad     []string          // handled for the first time after a newer one
	replays int               // handled again after a newer one
}

func newOrderLog() *orderLog {
	return &orderLog{seen: map[string]int{}, newest: map[string]int{}, at: map[string]string{}}
}

func (o *orderLog) handle(_ context.Context, m *omnibus.Message) error {
	// Handlers of varying speed: every fourth key slow, the others quick.
	if key, _ := strconv.Atoi(m.Key[1:]); key%4 == 0 {
		time.Sleep(time.Duration(5+rand.IntN(10)) * time.Millisecond)
	} else {
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
	}
	o.record(m)
	return nil
}

// record checks m, numbered in header n, against key order and counts it.
func (o *orderLog) record(m *omnibus.Message) {
	n, _ := strconv.Atoi(m.Headers["n"])
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls++
	o.seen[m.ID]++
	if last, ok := o.newest[m.Key]; ok && n < last {
		if o.seen[m.ID] > 1 {
			o.replays++ // handled before: at least once lets it come again
			return
		}
		o.bad = append(o.bad, fmt.Sprintf("key %s: message %d (position %s, lane %s, delivery %d of it, attempt %d) settled after %d (position %s)",
			m.Key, n, m.Position, m.Lane, o.seen[m.ID], m.Attempt, last, o.at[m.Key]))
		return
	}
	o.newest[m.Key], o.at[m.Key] = n, m.Position
}

func (o *orderLog) handled() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.seen)
}

func (o *orderLog) missing(ids []string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, id := range ids {
		if o.seen[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// result returns the handler calls, the duplicates and the violations.
func (o *orderLog) result() (calls, dups, replays int, bad []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, n := range o.seen {
		dups += n - 1
	}
	return o.calls, dups, o.replays, append([]string(nil), o.bad...)
}

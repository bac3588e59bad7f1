package rabbitbus

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestHeldNotRunIsNotCounted: in partitioned mode, a partition's message
// that holders took and dropped without running it (as a process killed
// by another partition's message does) comes back with its quorum
// x-delivery-count raised each time. With MaxAttempts 3, a member must
// run it, as its second holder to run it (the first counts as having
// run), not dead-letter it. Raw consumers play the crashed holders.
func TestHeldNotRunIsNotCounted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const params = "queue_type=quorum&partitions=2&rebalance=300ms"
	c := open(ctx, t, params)
	dc := c.Driver().(*conn)
	topic, group := "runs-"+omnibus.NewID()[12:], "g"
	if err := c.CreateTopic(ctx, topic+".dlq", 1); err != nil {
		t.Fatal(err)
	}
	// The group's queues, made by a member that joined and left.
	transporttest.ConsumeSome(t, c, topic, group, 2)

	if err := c.Publish(ctx, topic, &omnibus.Message{Key: "k", Body: []byte("held")}); err != nil {
		t.Fatal(err)
	}
	ac, ch := rawChannel(t)
	defer ac.Close()
	// Find the partition the message went to.
	queue := ""
	transporttest.Eventually(t, 10*time.Second, func() bool {
		for _, q := range dc.groupQueues(topic, group) {
			if st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); err == nil && st.Messages == 1 {
				queue = q
				return true
			}
		}
		return false
	}, func() string { return "the message is in no partition queue" })
	_ = ch.Close()

	// Four holders take it and drop their channel without settling it.
	for i := range 4 {
		hc, err := ac.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if err := hc.Qos(1, 0, false); err != nil {
			t.Fatal(err)
		}
		dels, err := hc.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-dels:
			n, _ := integer(d.Headers["x-delivery-count"])
			if n != i {
				t.Fatalf("holder %d: x-delivery-count %d, want %d", i+1, n, i)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("holder %d got nothing from %s", i+1, queue)
		}
		_ = hc.Close() // held, never run, never acknowledged
	}

	var mu sync.Mutex
	var attempts []int
	k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		attempts = append(attempts, m.Attempt)
		mu.Unlock()
		return nil
	}, omnibus.Group(group), omnibus.MaxAttempts(3))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	transporttest.Eventually(t, 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) > 0
	}, func() string {
		return fmt.Sprintf("the message, held 4 times and never run, was not handled; the dead-letter queue holds %d", dlqDepth(t, ac, topic+".dlq"))
	})
	mu.Lock()
	if len(attempts) != 1 || attempts[0] != 2 {
		t.Errorf("the handler saw attempts %v, want [2] (the first holder and this one)", attempts)
	}
	mu.Unlock()
	if n := dlqDepth(t, ac, topic+".dlq"); n != 0 {
		t.Errorf("the dead-letter queue holds %d messages, want none", n)
	}
	// The group's run records: the one CountRun wrote, then the one Ack
	// wrote to forget it.
	var recs []string
	transporttest.Eventually(t, 10*time.Second, func() bool {
		recs = runRecords(t, ac, runsQueue(topic, group))
		return len(recs) == 2
	}, func() string { return fmt.Sprintf("run records %v, want a run and a done", recs) })
	if !strings.HasSuffix(recs[0], " ran") || !strings.HasSuffix(recs[1], " done") || recs[0][:len(recs[0])-4] != recs[1][:len(recs[1])-5] {
		t.Errorf("run records %v, want a run and a done of one message", recs)
	}
}

// runRecords reads the run records of stream queue from its first, as
// "<key> ran" and "<key> done".
func runRecords(t *testing.T, ac *amqp.Connection, queue string) []string {
	t.Helper()
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Qos(100, 0, false); err != nil {
		t.Fatal(err)
	}
	dels, err := ch.Consume(queue, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		select {
		case d := <-dels:
			what := " ran"
			if _, ok := d.Headers[hdrRunDone]; ok {
				what = " done"
			}
			out = append(out, str(d.Headers[hdrRunKey])+what)
			_ = d.Ack(false)
		case <-time.After(500 * time.Millisecond):
			return out
		}
	}
}

// dlqDepth returns how many messages queue holds, -1 if it cannot tell.
func dlqDepth(t *testing.T, ac *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := ac.Channel()
	if err != nil {
		return -1
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return st.Messages
}

// TestRunsRefusedCountsDeliveries: where the server refuses the group's
// stream of run records (here a classic queue has its name; a server
// without stream queues refuses it too), a partitioned member subscribes
// and consumes all the same, counting deliveries as before run counts.
func TestRunsRefusedCountsDeliveries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := open(ctx, t, "partitions=2&rebalance=300ms")
	dc := c.Driver().(*conn)
	topic, group := "runs-"+omnibus.NewID()[12:], "g"
	ac, ch := rawChannel(t)
	defer ac.Close()
	squat := runsQueue(topic, group)
	if _, err := ch.QueueDeclare(squat, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic}); err != nil {
		t.Fatal(err)
	}
	dc.record("q", squat)
	transporttest.ConsumeSome(t, c, topic, group, 10)
	sub, err := dc.Subscribe(ctx, topic, driver.SubscribeOptions{Group: group, MaxInFlight: 1, Lanes: nopLanes{}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, ok := sub.(driver.RunCounter); ok {
		t.Error("the member counts runs without its stream")
	}
}

type nopLanes struct{}

func (nopLanes) Claimed([]string)                  {}
func (nopLanes) Revoked(context.Context, []string) {}
func (nopLanes) Lost([]string)                     {}

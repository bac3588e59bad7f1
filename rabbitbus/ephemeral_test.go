package rabbitbus

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/transporttest"
)

// A group the user did not name gets queues that expire once unused, so a
// throwaway subscription (omnibus tail, say) leaves nothing behind.
func TestThrowawayGroupQueuesExpire(t *testing.T) {
	ctx := context.Background()
	c := open(ctx, t, "")
	topic := "omnibus-throwaway-" + strings.ToLower(omnibus.NewID())
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	queue := groupQueue(topic, k.Group())
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	// Declaring the queue again without x-expires must be refused as
	// inequivalent: the server holds it with x-expires.
	ac, ch := rawChannel(t)
	defer ac.Close()
	_, err = ch.QueueDeclare(queue, true, false, false, false, c.Driver().(*conn).queueArgs())
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(ae.Reason, "x-expires") {
		t.Fatalf("re-declaring %q without x-expires: %v; want PRECONDITION_FAILED about x-expires", queue, err)
	}
	// A named group keeps its queue.
	named, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("kept"))
	if err != nil {
		t.Fatal(err)
	}
	named.Close()
	ch2, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch2.QueueDeclare(groupQueue(topic, "kept"), true, false, false, false, c.Driver().(*conn).queueArgs()); err != nil {
		t.Errorf("a named group's queue has arguments it should not: %v", err)
	}
}

// Client.Lag reads a group's queue depths from outside the group, one
// lane per queue; a queue it cannot read is a lane of unknown lag.
func TestGroupLag(t *testing.T) {
	for _, tt := range []struct {
		name, params string
		lanes        int
	}{{"plain", "", 1}, {"partitioned", "partitions=4", 4}} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			c := open(ctx, t, tt.params)
			topic := "omnibus-grouplag-" + strings.ToLower(omnibus.NewID())
			k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("billing"))
			if err != nil {
				t.Fatal(err)
			}
			k.Close() // the queues stay; nobody consumes
			const n = 40
			for i := range n {
				if err := c.Publish(ctx, topic, &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte("x")}); err != nil {
					t.Fatal(err)
				}
			}
			lags, err := c.Lag(ctx, topic, "billing")
			sum := int64(0)
			for _, l := range lags {
				if !l.Known {
					t.Errorf("lane %s unknown: %+v", l.Lane, lags)
				}
				sum += l.Lag
			}
			if err != nil || len(lags) != tt.lanes || sum != n {
				t.Fatalf("Lag = %+v, %v; want %d lanes holding %d", lags, err, tt.lanes, n)
			}
			if _, err := c.Lag(ctx, topic, "nobody"); !errors.Is(err, omnibus.ErrNotFound) {
				t.Errorf("Lag of a missing group: %v, want ErrNotFound", err)
			}
			if tt.lanes == 1 {
				return
			}
			// A partition queue gone: its lane is unknown, the others read.
			ac, ch := rawChannel(t)
			defer ac.Close()
			if _, err := ch.QueueDelete(partitionQueue(topic, "billing", 2), false, false, false); err != nil {
				t.Fatal(err)
			}
			lags, err = c.Lag(ctx, topic, "billing")
			if err != nil || len(lags) != tt.lanes {
				t.Fatalf("Lag after a queue went = %+v, %v", lags, err)
			}
			for _, l := range lags {
				if l.Known != (l.Lane != "2") {
					t.Errorf("lane %s Known %v after queue 2 went: %+v", l.Lane, l.Known, lags)
				}
			}
		})
	}
}

// TestGroupLagOtherLayout: a client whose URL names another layout than
// the group's (no partitions, or fewer) reads the group as its members
// made it: every lane, every message, and the member. Read with the URL's
// layout, a partitioned group was not found from an unpartitioned client,
// and a client with 2 partitions saw half of a 4-partition group.
func TestGroupLagOtherLayout(t *testing.T) {
	for _, tt := range []struct {
		name, made string
		lanes      int
		readers    []string
	}{
		{"partitioned", "partitions=4", 4, []string{"", "partitions=2"}},
		{"plain", "", 1, []string{"partitions=4"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			c := open(ctx, t, tt.made)
			topic := "omnibus-layout-" + strings.ToLower(omnibus.NewID())
			nop := func(context.Context, *omnibus.Message) error { return nil }
			k, err := c.Subscribe(ctx, topic, nop, omnibus.Group("billing"))
			if err != nil {
				t.Fatal(err)
			}
			k.Close() // the queues stay; nobody consumes
			const n = 40
			for i := range n {
				if err := c.Publish(ctx, topic, &omnibus.Message{Key: "k" + strconv.Itoa(i), Body: []byte("x")}); err != nil {
					t.Fatal(err)
				}
			}
			readers := make([]*conn, len(tt.readers))
			for i, params := range tt.readers {
				readers[i] = open(ctx, t, params).Driver().(*conn)
				lags, err := readers[i].GroupLag(ctx, topic, "billing")
				sum := int64(0)
				for _, l := range lags {
					if !l.Known {
						t.Errorf("reader %q: lane %s unknown: %+v", params, l.Lane, lags)
					}
					sum += l.Lag
				}
				if err != nil || len(lags) != tt.lanes || sum != n {
					t.Errorf("reader %q: GroupLag = %+v, %v; want %d lanes holding %d", params, lags, err, tt.lanes, n)
				}
				if m, err := readers[i].GroupMembers(ctx, topic, "billing"); err != nil || m != 0 {
					t.Errorf("reader %q: GroupMembers of a stopped group = %d, %v; want 0", params, m, err)
				}
				if _, err := readers[i].GroupLag(ctx, topic, "nobody"); !errors.Is(err, driver.ErrNotFound) {
					t.Errorf("reader %q: GroupLag of a missing group: %v, want ErrNotFound", params, err)
				}
			}
			k, err = c.Subscribe(ctx, topic, nop, omnibus.Group("billing"))
			if err != nil {
				t.Fatal(err)
			}
			transporttest.RunConsumer(t, k)
			for i, r := range readers {
				deadline := time.Now().Add(10 * time.Second)
				m, err := r.GroupMembers(ctx, topic, "billing")
				for (err != nil || m != 1) && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
					m, err = r.GroupMembers(ctx, topic, "billing")
				}
				if err != nil || m != 1 {
					t.Errorf("reader %q: GroupMembers with one member = %d, %v; want 1", tt.readers[i], m, err)
				}
			}
		})
	}
}

package rabbitbus

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
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
	ac, err := amqp.Dial(testURL)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
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

// Client.Lag reads a group's queue depth from outside the group.
func TestGroupLag(t *testing.T) {
	ctx := context.Background()
	c := open(ctx, t, "")
	topic := "omnibus-grouplag-" + strings.ToLower(omnibus.NewID())
	k, err := c.Subscribe(ctx, topic, func(context.Context, *omnibus.Message) error { return nil }, omnibus.Group("billing"))
	if err != nil {
		t.Fatal(err)
	}
	k.Close() // the queue stays; nobody consumes
	for range 5 {
		if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	lags, err := c.Lag(ctx, topic, "billing")
	if err != nil || len(lags) != 1 || !lags[0].Known || lags[0].Lag != 5 {
		t.Fatalf("Lag = %+v, %v; want one lane with 5", lags, err)
	}
	if _, err := c.Lag(ctx, topic, "nobody"); !errors.Is(err, omnibus.ErrNotFound) {
		t.Errorf("Lag of a missing group: %v, want ErrNotFound", err)
	}
}

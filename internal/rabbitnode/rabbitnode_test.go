package rabbitnode

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestNodeKeepsDurableMessagesAcrossRestarts: the node comes up, keeps a
// persistent message in a durable queue across a graceful restart and a
// kill, and its connections see the restart.
func TestNodeKeepsDurableMessagesAcrossRestarts(t *testing.T) {
	n := Start(t)
	ac, err := amqp.Dial(n.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	closed := ac.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("kept", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", "kept", false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil { // waits for the publish to be taken
		t.Fatal(err)
	}
	n.Restart()
	if _, ok := <-closed; !ok {
		t.Log("connection closed without a reason")
	}
	n.Kill()
	n.Start()
	ac, err = amqp.Dial(n.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ch, err = ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive("kept", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 1 {
		t.Fatalf("queue holds %d messages after a restart and a kill, want 1", q.Messages)
	}
}

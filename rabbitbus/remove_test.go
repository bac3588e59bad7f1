package rabbitbus

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestDeleteTopicAndGroup: after a group consumed from a topic,
// unpartitioned and partitioned, DeleteGroup removes the group's queues,
// its retry queue and its consistent-hash exchange and leaves the topic's
// exchange; DeleteTopic removes that, as passive declares on a raw
// connection see them; removing them again is no error.
func TestDeleteTopicAndGroup(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "", "partitioned": "partitions=3&rebalance=500ms"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c := open(ctx, t, params)
			dc := c.Driver().(*conn)
			topic, group := "remove-"+omnibus.NewID()[12:], "g"
			if err := c.CreateTopic(ctx, topic, 3); err != nil {
				t.Fatal(err)
			}
			transporttest.ConsumeSome(t, c, topic, group, 30)
			// A retry queue, as a Nack of 1s declares it.
			retry := retryQueue(topic, group, retryBucket(time.Second))
			ac, ch := rawChannel(t)
			defer ac.Close()
			if _, err := ch.QueueDeclare(retry, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			dc.record("q", retry)

			exists := func(kind, name string) bool { return onServer(t, ac, kind, name) }
			groupState := []string{"q:" + retry}
			for _, q := range dc.groupQueues(topic, group) {
				groupState = append(groupState, "q:"+q)
			}
			if params != "" {
				groupState = append(groupState, "x:"+hashExchange(topic, group), "q:"+runsQueue(topic, group))
			}
			// left lists what of names is on the server.
			left := func(names []string) []string {
				var have []string
				for _, n := range names {
					if exists(n[:1], n[2:]) {
						have = append(have, n)
					}
				}
				return have
			}
			if have := left(groupState); len(have) != len(groupState) || !exists("x", topic) || len(groupState) < 2 {
				t.Fatalf("before removal: the server has %v of the group's %v, and the topic's exchange: %v", have, groupState, exists("x", topic))
			}
			transporttest.Remove(t, c, topic, group, func() {
				if have := left(groupState); len(have) > 0 || !exists("x", topic) {
					t.Errorf("after DeleteGroup: %v of the group left, and the topic's exchange: %v; want none, and the exchange", have, exists("x", topic))
				}
			})
			if exists("x", topic) {
				t.Error("the topic's exchange is there after DeleteTopic")
			}
		})
	}
}

// TestDeleteGroupWithMember: DeleteGroup under a running member,
// unpartitioned and partitioned, deletes the group's queues (RabbitMQ
// cancels the member's consumers); the member declares and binds them
// again and gets everything published once it consumes them. What is published before, with
// no queue bound to take it, the exchange drops: that window is the
// doc's. Once the member stopped, DeleteGroup leaves nothing of the
// group, as passive declares on a raw connection see.
func TestDeleteGroupWithMember(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "", "partitioned": "partitions=3&rebalance=500ms"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c := open(ctx, t, params)
			dc := c.Driver().(*conn)
			topic, group := "busy-"+omnibus.NewID()[12:], "g"
			if err := c.CreateTopic(ctx, topic, 3); err != nil {
				t.Fatal(err)
			}
			ac, _ := rawChannel(t)
			t.Cleanup(func() { _ = ac.Close() })
			exists := func(kind, name string) bool { return onServer(t, ac, kind, name) }
			var state []string
			for _, q := range dc.groupQueues(topic, group) {
				state = append(state, "q:"+q)
			}
			if params != "" {
				state = append(state, "x:"+hashExchange(topic, group))
			}
			left := func() []string {
				var have []string
				for _, n := range state {
					if exists(n[:1], n[2:]) {
						have = append(have, n)
					}
				}
				return have
			}
			// consumed tells whether every queue of the group is there
			// with a consumer on it: the member declared and bound it
			// again (declared alone, it takes nothing yet).
			consumed := func() bool {
				for _, q := range dc.groupQueues(topic, group) {
					ch, err := ac.Channel()
					if err != nil {
						t.Fatal(err)
					}
					st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
					_ = ch.Close()
					if err != nil || st.Consumers == 0 {
						return false
					}
				}
				return true
			}
			transporttest.DeleteUnderMember(t, c, topic, group, 30, transporttest.Busy{
				Back: func() bool { return consumed() && len(left()) == len(state) },
				Gone: func() {
					if have := left(); len(have) > 0 {
						t.Errorf("after DeleteGroup of the stopped member: %v left; want nothing", have)
					}
				},
			})
		})
	}
}

// onServer tells, by a passive declare on a channel of its own, whether
// the exchange ("x") or queue ("q") name is on the server.
func onServer(t *testing.T, ac *amqp.Connection, kind, name string) bool {
	t.Helper()
	ch, err := ac.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if kind == "x" {
		err = ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil) // the kind is not checked
	} else {
		_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// TestDeleteGroupOtherLayout: DeleteGroup through a client whose URL says
// another layout than the group was made with (unpartitioned, or fewer
// partitions) removes the group's partition queues and consistent-hash
// exchange all the same.
func TestDeleteGroupOtherLayout(t *testing.T) {
	for name, params := range map[string]string{"unpartitioned": "", "fewer partitions": "partitions=2"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			made := open(ctx, t, "partitions=4&rebalance=500ms")
			topic, group := "layout-"+omnibus.NewID()[12:], "g"
			if err := made.CreateTopic(ctx, topic, 4); err != nil {
				t.Fatal(err)
			}
			transporttest.ConsumeSome(t, made, topic, group, 20)
			ac, _ := rawChannel(t)
			t.Cleanup(func() { _ = ac.Close() })
			state := []string{"x:" + hashExchange(topic, group)}
			for p := range 4 {
				state = append(state, "q:"+partitionQueue(topic, group, p))
			}
			left := func() (have []string) {
				for _, s := range state {
					if onServer(t, ac, s[:1], s[2:]) {
						have = append(have, s)
					}
				}
				return have
			}
			if have := left(); len(have) != len(state) {
				t.Fatalf("before removal: the server has %v of the group's %v", have, state)
			}
			other := open(ctx, t, params)
			if err := other.Driver().(*conn).DeleteGroup(ctx, topic, group); err != nil {
				t.Fatal(err)
			}
			if have := left(); len(have) > 0 {
				t.Errorf("after DeleteGroup through a client with %q: %v of the group left; want none", params, have)
			}
			if err := made.Driver().(*conn).DeleteTopic(ctx, topic); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestDeleteDeadLetterGroup: the group named after a dead-letter topic
// is the queue keeping its dead letters (the dlq tools' group):
// DeleteGroup removes that queue, and leaves the topic's exchange.
func TestDeleteDeadLetterGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := open(ctx, t, "")
	topic := "dead-" + omnibus.NewID()[12:] + dlqSuffix
	if err := c.Publish(ctx, topic, &omnibus.Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ac, _ := rawChannel(t)
	t.Cleanup(func() { _ = ac.Close() })
	if !onServer(t, ac, "q", topic) || !onServer(t, ac, "x", topic) {
		t.Fatalf("before removal: queue %v, exchange %v; want both", onServer(t, ac, "q", topic), onServer(t, ac, "x", topic))
	}
	dc := c.Driver().(*conn)
	if err := dc.DeleteGroup(ctx, topic, topic); err != nil {
		t.Fatal(err)
	}
	if onServer(t, ac, "q", topic) || !onServer(t, ac, "x", topic) {
		t.Errorf("after DeleteGroup: queue %v, exchange %v; want the queue gone, the exchange kept", onServer(t, ac, "q", topic), onServer(t, ac, "x", topic))
	}
	if err := dc.DeleteTopic(ctx, topic); err != nil {
		t.Error(err)
	}
}

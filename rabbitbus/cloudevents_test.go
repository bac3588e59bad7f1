package rabbitbus

// The CloudEvents AMQP protocol binding, checked against its written
// rules: its SDK bindings speak AMQP 1.0, which RabbitMQ does not by
// default, so a raw AMQP 0-9-1 client plays the other CloudEvents party.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

func TestCloudEventsAMQPBinding(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := open(ctx, t, "")
	ac, ch := rawChannel(t)
	defer ac.Close()
	when := time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC)

	t.Run("omnibus writes the binding", func(t *testing.T) {
		topic := "omnibus-ce-" + strings.ToLower(omnibus.NewID())
		if err := declareTopic(ch, topic); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteTopology(t, []string{"x:" + topic}) })
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q.Name, "#", topic, false, nil); err != nil {
			t.Fatal(err)
		}
		m := &omnibus.Message{ID: "ce-1", Key: "customer-7", Type: "order.created", Source: "/shop/orders", Time: when,
			ContentType: "application/json", Headers: map[string]string{"tenant": "acme", "subject": "order-42", "trace-id": "abc"},
			Body: []byte(`{"total":42}`)}
		if err := c.Publish(ctx, topic, m); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		var d amqp.Delivery
		for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
			var ok bool
			if d, ok, err = ch.Get(q.Name, true); err != nil {
				t.Fatal(err)
			} else if ok {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatal("no message in the raw queue after 30s")
			}
		}
		// 3.1.1: the content-type property is datacontenttype.
		if d.ContentType != m.ContentType || string(d.Body) != string(m.Body) {
			t.Errorf("content-type %q body %q; want %q %q", d.ContentType, d.Body, m.ContentType, m.Body)
		}
		// 3.1.3: every other attribute is an application property named
		// cloudEvents:<attribute>; extensions too.
		want := amqp.Table{
			"cloudEvents:specversion": "1.0", "cloudEvents:id": "ce-1", "cloudEvents:type": "order.created",
			"cloudEvents:source": "/shop/orders", "cloudEvents:time": "2026-12-02T10:11:12.123456789Z",
			"cloudEvents:partitionkey": "customer-7", "cloudEvents:tenant": "acme", "cloudEvents:subject": "order-42",
			"trace-id": "abc", // no attribute name: a plain application property
		}
		for k, v := range want {
			if d.Headers[k] != v {
				t.Errorf("application property %s = %v, want %v (all: %v)", k, d.Headers[k], v, d.Headers)
			}
		}
		for _, k := range []string{"cloudEvents:datacontenttype", "tenant", "subject"} {
			if v, ok := d.Headers[k]; ok {
				t.Errorf("application property %s = %v; want none (all: %v)", k, v, d.Headers)
			}
		}
	})

	t.Run("omnibus reads the binding", func(t *testing.T) {
		topic := "omnibus-ce-" + strings.ToLower(omnibus.NewID())
		var mu sync.Mutex
		var got *omnibus.Message
		k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
			mu.Lock()
			defer mu.Unlock()
			cp := *m
			got = &cp
			return nil
		}, omnibus.Group("g"))
		if err != nil {
			t.Fatal(err)
		}
		transporttest.RunConsumer(t, k)
		// A CloudEvents producer: no message-id, type or app-id
		// properties; the time as a string with nanoseconds; an
		// extension in the underscore spelling JMS clients use.
		err = ch.PublishWithContext(ctx, topic, "customer-7", false, false, amqp.Publishing{
			ContentType: "text/plain",
			Headers: amqp.Table{
				"cloudEvents:specversion": "1.0", "cloudEvents:id": "raw-1", "cloudEvents:type": "invoice.paid",
				"cloudEvents:source": "/billing", "cloudEvents:time": "2026-12-02T10:11:12.123456789Z",
				"cloudEvents_tenant": "acme", "cloudEvents:subject": "inv-9", "Region": "eu",
			},
			Body: []byte("paid"),
		})
		if err != nil {
			t.Fatal(err)
		}
		for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			m := got
			mu.Unlock()
			if m != nil {
				if m.ID != "raw-1" || m.Type != "invoice.paid" || m.Source != "/billing" || !m.Time.Equal(when) ||
					m.ContentType != "text/plain" || m.Key != "customer-7" || string(m.Body) != "paid" {
					t.Errorf("delivered id %q type %q source %q time %s content type %q key %q body %q",
						m.ID, m.Type, m.Source, m.Time.Format(time.RFC3339Nano), m.ContentType, m.Key, m.Body)
				}
				if len(m.Headers) != 3 || m.Headers["tenant"] != "acme" || m.Headers["subject"] != "inv-9" || m.Headers["Region"] != "eu" {
					t.Errorf("delivered headers %v; want exactly tenant=acme, subject=inv-9, Region=eu", m.Headers)
				}
				return
			}
			if time.Since(start) > 30*time.Second {
				t.Fatal("omnibus received nothing in 30s")
			}
		}
	})
}

// TestDecodeNativeTime: the binding lets cloudEvents:time be a native
// AMQP timestamp (seconds in 0-9-1) as well as a string.
func TestDecodeNativeTime(t *testing.T) {
	when := time.Date(2026, 12, 2, 10, 11, 12, 0, time.UTC)
	m, _ := decode(&amqp.Delivery{Headers: amqp.Table{"cloudEvents:id": "x", "cloudEvents:time": when}}, false)
	if !m.Time.Equal(when) || m.ID != "x" {
		t.Errorf("decoded id %q time %v; want x, %v", m.ID, m.Time, when)
	}
}

// TestDecodeStructured: a message whose content-type is the CloudEvents
// JSON format carries the event in its body (structured content mode).
func TestDecodeStructured(t *testing.T) {
	m, _ := decode(&amqp.Delivery{RoutingKey: "k", ContentType: "application/cloudevents+json", Body: []byte(
		`{"specversion":"1.0","id":"s-1","type":"t","source":"/s","tenant":"acme","datacontenttype":"text/plain","data":"hi"}`)}, false)
	if m.ID != "s-1" || m.Type != "t" || m.Source != "/s" || m.Key != "k" || m.ContentType != "text/plain" ||
		string(m.Body) != "hi" || len(m.Headers) != 1 || m.Headers["tenant"] != "acme" {
		t.Errorf("decoded %+v", m)
	}
}

package nsqbus_test

// Interoperability with the CloudEvents SDK for Go. The SDK has no NSQ
// binding, so the tests move the JSON event format (structured content
// mode) with raw go-nsq and have the SDK encode and decode it. The SDK
// is a test dependency only.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nsqio/go-nsq"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/cetest"
	"github.com/omnibus-go/omnibus/transporttest"
)

func TestCloudEventsSDK(t *testing.T) {
	n, _ := cluster(t)
	c := transporttest.Open(t, directURL(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("SDK reads omnibus", func(t *testing.T) {
		topic := fmt.Sprintf("ce-to-sdk-%x", rand.Uint32())
		t.Cleanup(func() { deleteTopic(t, topic) })
		if err := postNSQD(n.HTTPAddr(), "/topic/create", topic, ""); err != nil {
			t.Fatal(err)
		}
		if err := postNSQD(n.HTTPAddr(), "/channel/create", topic, "sdk"); err != nil {
			t.Fatal(err)
		}
		want := cetest.Message()
		if err := c.Publish(ctx, topic, want); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		body := rawReceive(t, n.TCPAddr(), topic, "sdk")
		var e cloudevents.Event
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("the SDK cannot read %s: %v", body, err)
		}
		// The header that cannot be an extension rides in one that can.
		var hs map[string]string
		if raw, ok := e.Extensions()["omnibusheaders"].(string); !ok || json.Unmarshal([]byte(raw), &hs) != nil || hs["trace-id"] != want.Headers["trace-id"] || len(hs) != 1 {
			t.Errorf("extension omnibusheaders = %v, want {\"trace-id\": %q}", e.Extensions()["omnibusheaders"], want.Headers["trace-id"])
		}
		e.SetExtension("omnibusheaders", nil)
		cetest.CheckEvent(t, e, want)
	})

	t.Run("omnibus reads SDK", func(t *testing.T) {
		topic := fmt.Sprintf("ce-from-sdk-%x", rand.Uint32())
		t.Cleanup(func() { deleteTopic(t, topic) })
		want := cetest.Message()
		body, err := json.Marshal(cetest.Event(t, want))
		if err != nil {
			t.Fatal(err)
		}
		cetest.CheckDelivered(t, rawToOmnibus(ctx, t, c, n.TCPAddr(), topic, body), want)
	})

	t.Run("binary envelope", func(t *testing.T) {
		// A client with envelope=binary publishes; one without reads
		// (readers take both envelopes), and so does go-nsq, which gets
		// the envelope itself.
		topic := fmt.Sprintf("ce-binary-%x", rand.Uint32())
		t.Cleanup(func() { deleteTopic(t, topic) })
		cb := transporttest.Open(t, directURL(t, "envelope=binary"))
		want := cetest.Message()
		want.Body = []byte{0, 1, 2, 0xff}
		want.ContentType = ""
		got := firstMessage(ctx, t, c, topic)
		if err := postNSQD(n.HTTPAddr(), "/channel/create", topic, "raw"); err != nil {
			t.Fatal(err)
		}
		if err := cb.Publish(ctx, topic, want); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		select {
		case m := <-got:
			if m.ID != want.ID || m.Type != want.Type || m.Source != want.Source || m.ContentType != want.ContentType || m.Key != want.Key ||
				!m.Time.Equal(want.Time) || !bytes.Equal(m.Body, want.Body) || !maps.Equal(m.Headers, want.Headers) {
				t.Errorf("delivered %+v\nwant %+v", m, want)
			}
		case <-ctx.Done():
			t.Fatal("omnibus received nothing")
		}
		if body := rawReceive(t, n.TCPAddr(), topic, "raw"); !bytes.HasPrefix(body, []byte("\x00OMB\x01")) || !bytes.HasSuffix(body, want.Body) {
			t.Errorf("go-nsq received %q; want the binary envelope", body)
		}
	})

	t.Run("omnibus reads plain NSQ", func(t *testing.T) {
		topic := fmt.Sprintf("ce-plain-%x", rand.Uint32())
		t.Cleanup(func() { deleteTopic(t, topic) })
		before := time.Now()
		m := rawToOmnibus(ctx, t, c, n.TCPAddr(), topic, []byte(`{"not":"a CloudEvent"}`))
		if string(m.Body) != `{"not":"a CloudEvent"}` || len(m.ID) != 16 || m.Position != m.ID || m.Time.Before(before.Add(-time.Second)) {
			t.Errorf("delivered %+v; want the body as it is, NSQ's message ID and timestamp", m)
		}
	})
}

// rawToOmnibus subscribes c to topic, publishes body with go-nsq to the
// nsqd at addr, and returns the message omnibus delivered.
func rawToOmnibus(ctx context.Context, t *testing.T, c *omnibus.Client, addr, topic string, body []byte) *omnibus.Message {
	t.Helper()
	got := firstMessage(ctx, t, c, topic)
	p, err := nsq.NewProducer(addr, nsq.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.Publish(topic, body); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		return m
	case <-ctx.Done():
		t.Fatal("omnibus received nothing")
		return nil
	}
}

// rawReceive reads one message of topic's channel with go-nsq and
// returns its body.
func rawReceive(t *testing.T, addr, topic, channel string) []byte {
	t.Helper()
	cons, err := nsq.NewConsumer(topic, channel, nsq.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	cons.SetLoggerLevel(nsq.LogLevelError)
	bodies := make(chan []byte, 1)
	cons.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		select {
		case bodies <- m.Body:
		default:
		}
		return nil
	}))
	if err := cons.ConnectToNSQD(addr); err != nil {
		t.Fatal(err)
	}
	defer func() { cons.Stop(); <-cons.StopChan }()
	select {
	case b := <-bodies:
		return b
	case <-time.After(30 * time.Second):
		t.Fatal("go-nsq received nothing")
		return nil
	}
}

// clone copies what a handler may not keep past its return.
func clone(m *omnibus.Message) *omnibus.Message {
	cp := *m
	cp.Body = bytes.Clone(m.Body)
	cp.Headers = maps.Clone(m.Headers)
	return &cp
}

// firstMessage runs a consumer of topic in group "omnibus" on c and
// returns a channel that gets (a copy of) the first message it handles.
func firstMessage(ctx context.Context, t *testing.T, c *omnibus.Client, topic string) <-chan *omnibus.Message {
	t.Helper()
	got := make(chan *omnibus.Message, 1)
	k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		select {
		case got <- clone(m):
		default:
		}
		return nil
	}, omnibus.Group("omnibus"))
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunConsumer(t, k)
	return got
}

package natsbus_test

// Interoperability with the CloudEvents SDK for Go (its JetStream
// binding), both ways, on the embedded server and the machine's, on plain
// and partitioned topics. The SDK is a test dependency only.

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ce_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/cetest"
	"github.com/omnibus-go/omnibus/natsbus"
)

func TestCloudEventsSDK(t *testing.T) {
	for server, base := range servers(t) {
		for _, parts := range []int{0, 4} {
			mode := "Plain"
			u := base
			if parts > 0 {
				mode = "Partitioned"
				sep := "?"
				if strings.Contains(u, "?") {
					sep = "&"
				}
				u += sep + partitionedParams
			}
			t.Run(server+"/"+mode, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				c := open(t, u)
				_, nc, err := natsbus.OpenConn(ctx, u) // the SDK's connection
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				// subject is where a message of cetest.Message's key goes.
				subject := func(topic string) string {
					if parts == 0 {
						return topic
					}
					return topic + "." + strconv.Itoa(natsbus.Partition(cetest.Message().Key, parts))
				}

				t.Run("SDK reads omnibus", func(t *testing.T) {
					topic := newTopic(ctx, t, c, base, max(parts, 1))
					want := cetest.Message()
					if err := c.Publish(ctx, topic, want); err != nil {
						t.Fatalf("Publish: %v", err)
					}
					consumer, err := ce_jetstream.NewConsumerFromConn(nc, natsbus.StreamName(topic), subject(topic), nil, nil)
					if err != nil {
						t.Fatalf("SDK consumer: %v", err)
					}
					client, err := cloudevents.NewClient(consumer)
					if err != nil {
						t.Fatal(err)
					}
					rctx, stop := context.WithCancel(ctx)
					defer stop()
					events := make(chan cloudevents.Event, 1)
					done := make(chan error, 1)
					go func() {
						done <- client.StartReceiver(rctx, func(e cloudevents.Event) {
							select {
							case events <- e:
							default:
							}
						})
					}()
					select {
					case e := <-events:
						cetest.CheckEvent(t, e, want)
					case err := <-done:
						t.Fatalf("SDK receiver ended before an event: %v", err)
					case <-time.After(30 * time.Second):
						t.Fatal("SDK received no event in 30s (a message it cannot decode is dropped with a log line)")
					}
					stop()
					if err := <-done; err != nil {
						t.Errorf("SDK receiver: %v", err)
					}
				})

				t.Run("omnibus reads SDK", func(t *testing.T) {
					topic := newTopic(ctx, t, c, base, max(parts, 1))
					want := cetest.Message()
					delete(want.Headers, "trace-id")
					sender, err := ce_jetstream.NewSenderFromConn(nc, natsbus.StreamName(topic), subject(topic), nil)
					if err != nil {
						t.Fatalf("SDK sender: %v", err)
					}
					client, err := cloudevents.NewClient(sender)
					if err != nil {
						t.Fatal(err)
					}
					if res := client.Send(ctx, cetest.Event(t, want)); !cloudevents.IsACK(res) {
						t.Fatalf("SDK send: %v", res)
					}
					cetest.CheckDelivered(t, receiveOne(ctx, t, c, topic), want)
				})
			})
		}
	}
}

// receiveOne subscribes to topic from its start and returns the first
// message delivered.
func receiveOne(ctx context.Context, t *testing.T, c *omnibus.Client, topic string) *omnibus.Message {
	t.Helper()
	var mu sync.Mutex
	var got *omnibus.Message
	k, err := c.Subscribe(ctx, topic, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if got == nil {
			cp := *m
			cp.Body = bytes.Clone(m.Body)
			got = &cp
		}
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	run(t, k)
	eventually(t, 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if got == nil {
			return errors.New("omnibus received nothing")
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	return got
}

// TestOldSpelling: messages omnibus wrote before it followed the NATS
// binding (Ce-Id, Ce-Type, ...) still decode, and a Content-Type header of
// another producer is the content type.
func TestOldSpelling(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := natsbus.EmbeddedURL(t.TempDir())
	c := open(t, u)
	topic := newTopic(ctx, t, c, u, 1)
	js := rawJetStream(t, u)
	when := time.Date(2025, 1, 2, 3, 4, 5, 6789, time.UTC)
	_, err := js.PublishMsg(ctx, &nats.Msg{Subject: topic, Data: []byte("old"), Header: nats.Header{
		"Ce-Id": {"old-1"}, "Nats-Msg-Id": {"old-1"}, "Ce-Specversion": {"1.0"}, "Ce-Type": {"order.created"},
		"Ce-Source": {"/shop"}, "Ce-Time": {when.Format(time.RFC3339Nano)}, "Ce-Partitionkey": {"k"},
		"traceparent": {"00-abc-def-01"}, "Content-Type": {"text/plain"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := receiveOne(ctx, t, c, topic)
	if got.ID != "old-1" || got.Type != "order.created" || got.Source != "/shop" || !got.Time.Equal(when) || got.Key != "k" ||
		got.ContentType != "text/plain" || string(got.Body) != "old" || len(got.Headers) != 1 || got.Headers["traceparent"] != "00-abc-def-01" {
		t.Errorf("delivered %+v", got)
	}
}

// TestServerHeaderRefused: the server acts on Nats-* headers (Nats-Rollup
// purges a subject), so a user header named so is refused.
func TestServerHeaderRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := natsbus.EmbeddedURL(t.TempDir())
	c := open(t, u)
	topic := newTopic(ctx, t, c, u, 1)
	err := c.Publish(ctx, topic, &omnibus.Message{Headers: map[string]string{"Nats-Rollup": "sub"}})
	if !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("Publish with a Nats-Rollup header: %v; want ErrInvalid", err)
	}
}

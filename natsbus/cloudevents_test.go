package natsbus_test

// Interoperability with the CloudEvents SDK for Go (its JetStream
// binding both ways, its core NATS binding's structured mode one way), on the embedded server and the machine's, on plain
// and partitioned topics. The SDK is a test dependency only.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	ce_nats "github.com/cloudevents/sdk-go/protocol/nats/v2"
	ce_jetstream "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/nats-io/nats.go"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/internal/cetest"
	"github.com/omnibus-go/omnibus/natsbus"
	"github.com/omnibus-go/omnibus/transporttest"
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
				c := transporttest.Open(t, u)
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
					cetest.CheckEvent(t, cetest.Receive(t, consumer, 30*time.Second), want)
				})

				t.Run("omnibus reads SDK", func(t *testing.T) {
					topic := newTopic(ctx, t, c, base, max(parts, 1))
					want := cetest.Message()
					sender, err := ce_jetstream.NewSenderFromConn(nc, natsbus.StreamName(topic), subject(topic), nil)
					if err != nil {
						t.Fatalf("SDK sender: %v", err)
					}
					cetest.Send(ctx, t, sender, want)
					cetest.CheckDelivered(t, cetest.Deliver(ctx, t, c, topic), want)
				})

				// The SDK's core NATS binding speaks structured mode only:
				// the JSON event as the payload, no headers.
				t.Run("omnibus reads SDK core NATS", func(t *testing.T) {
					topic := newTopic(ctx, t, c, base, max(parts, 1))
					want := cetest.Message()
					sender, err := ce_nats.NewSenderFromConn(nc, subject(topic))
					if err != nil {
						t.Fatalf("SDK sender: %v", err)
					}
					cetest.Send(ctx, t, sender, want)
					cetest.CheckDelivered(t, cetest.Deliver(ctx, t, c, topic), want)
				})
			})
		}
	}
}

// TestOldSpelling: messages omnibus wrote before it followed the NATS
// binding (Ce-Id, Ce-Type, ...) still decode, and a Content-Type header of
// another producer is the content type.
func TestOldSpelling(t *testing.T) {
	ctx, u, c, topic := embeddedTopic(t)
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
	got := cetest.Deliver(ctx, t, c, topic)
	if got.ID != "old-1" || got.Type != "order.created" || got.Source != "/shop" || !got.Time.Equal(when) || got.Key != "k" ||
		got.ContentType != "text/plain" || string(got.Body) != "old" || len(got.Headers) != 1 || got.Headers["traceparent"] != "00-abc-def-01" {
		t.Errorf("delivered %+v", got)
	}
}

// TestServerHeaderRefused: the server acts on Nats-* headers (Nats-Rollup
// purges a subject), so a user header named so is refused.
func TestServerHeaderRefused(t *testing.T) {
	ctx, _, c, topic := embeddedTopic(t)
	err := c.Publish(ctx, topic, &omnibus.Message{Headers: map[string]string{"Nats-Rollup": "sub"}})
	if !errors.Is(err, omnibus.ErrInvalid) {
		t.Errorf("Publish with a Nats-Rollup header: %v; want ErrInvalid", err)
	}
}

// embeddedTopic opens a client on an embedded server of the test's own
// and creates a topic there; the context ends after a minute.
func embeddedTopic(t *testing.T) (ctx context.Context, u string, c *omnibus.Client, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	u = natsbus.EmbeddedURL(t.TempDir())
	c = transporttest.Open(t, u)
	return ctx, u, c, newTopic(ctx, t, c, u, 1)
}

// Package cetest checks omnibus messages against the CloudEvents SDK for
// Go (github.com/cloudevents/sdk-go/v2) in the transports' tests. Only
// tests import it, so the SDK is a dependency of the tests alone.
package cetest

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// Message returns a message with every field a CloudEvent has, an
// extension (tenant), the subject attribute (a header of that name) and a
// header that cannot be an extension (trace-id).
func Message() *omnibus.Message {
	return &omnibus.Message{
		ID:          "ce-" + omnibus.NewID(),
		Key:         "customer-7",
		Type:        "order.created",
		Source:      "/shop/orders",
		Time:        time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC),
		ContentType: "application/json",
		Headers:     map[string]string{"tenant": "acme", "subject": "order-42", "trace-id": "abc def"},
		Body:        []byte(`{"total":42}`),
	}
}

// Event returns m as the SDK builds it: its key is the partitionkey
// extension, and only the headers that are attributes go along.
func Event(t testing.TB, m *omnibus.Message) cloudevents.Event {
	t.Helper()
	e := cloudevents.NewEvent()
	e.SetID(m.ID)
	e.SetType(m.Type)
	e.SetSource(m.Source)
	e.SetTime(m.Time)
	e.SetSubject(m.Headers["subject"])
	e.SetExtension("tenant", m.Headers["tenant"])
	e.SetExtension("partitionkey", m.Key)
	if err := e.SetData(m.ContentType, m.Body); err != nil {
		t.Fatal(err)
	}
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	return e
}

// CheckEvent compares the event the SDK decoded with the message omnibus
// published.
func CheckEvent(t testing.TB, e cloudevents.Event, want *omnibus.Message) {
	t.Helper()
	if err := e.Validate(); err != nil {
		t.Errorf("SDK event does not validate: %v", err)
	}
	if e.SpecVersion() != "1.0" || e.ID() != want.ID || e.Type() != want.Type || e.Source() != want.Source ||
		e.DataContentType() != want.ContentType || e.Subject() != want.Headers["subject"] {
		t.Errorf("SDK read specversion %q id %q type %q source %q datacontenttype %q subject %q\nwant 1.0 %q %q %q %q %q",
			e.SpecVersion(), e.ID(), e.Type(), e.Source(), e.DataContentType(), e.Subject(),
			want.ID, want.Type, want.Source, want.ContentType, want.Headers["subject"])
	}
	if !e.Time().Equal(want.Time) {
		t.Errorf("SDK read time %s, want %s", e.Time().Format(time.RFC3339Nano), want.Time.Format(time.RFC3339Nano))
	}
	if !bytes.Equal(e.Data(), want.Body) {
		t.Errorf("SDK read data %q, want %q", e.Data(), want.Body)
	}
	ext := e.Extensions()
	// The sarama binding adds the record's place on receive.
	for _, k := range []string{"kafkaoffset", "kafkapartition", "kafkatopic"} {
		delete(ext, k)
	}
	if len(ext) != 2 || ext["tenant"] != "acme" || ext["partitionkey"] != want.Key {
		t.Errorf("SDK read extensions %v; want exactly tenant=acme and partitionkey=%s", ext, want.Key)
	}
}

// CheckDelivered compares the message omnibus delivered with the one
// Event made the SDK's event of.
func CheckDelivered(t testing.TB, got, want *omnibus.Message) {
	t.Helper()
	if got.ID != want.ID || got.Type != want.Type || got.Source != want.Source || got.ContentType != want.ContentType || got.Key != want.Key {
		t.Errorf("omnibus delivered id %q type %q source %q content type %q key %q\nwant %q %q %q %q %q",
			got.ID, got.Type, got.Source, got.ContentType, got.Key, want.ID, want.Type, want.Source, want.ContentType, want.Key)
	}
	if !got.Time.Equal(want.Time) {
		t.Errorf("omnibus delivered time %s, want %s", got.Time.Format(time.RFC3339Nano), want.Time.Format(time.RFC3339Nano))
	}
	if !bytes.Equal(got.Body, want.Body) {
		t.Errorf("omnibus delivered body %q, want %q", got.Body, want.Body)
	}
	if got.Headers["tenant"] != "acme" || got.Headers["subject"] != want.Headers["subject"] || len(got.Headers) != 2 {
		t.Errorf("omnibus delivered headers %v; want exactly tenant=acme and subject=%s", got.Headers, want.Headers["subject"])
	}
}

// Receive runs an SDK client on the receiving protocol p until it has
// received an event, and returns that event; it fails the test after
// timeout.
func Receive(t testing.TB, p any, timeout time.Duration) cloudevents.Event {
	t.Helper()
	client, err := cloudevents.NewClient(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	events := make(chan cloudevents.Event, 1)
	done := make(chan error, 1)
	go func() {
		done <- client.StartReceiver(ctx, func(e cloudevents.Event) {
			select {
			case events <- e:
			default:
			}
		})
	}()
	var e cloudevents.Event
	select {
	case e = <-events:
	case err := <-done:
		t.Fatalf("SDK receiver ended before an event: %v", err)
	case <-ctx.Done():
		t.Fatalf("SDK received no event in %v (a message it cannot decode is dropped with a log line)", timeout)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("SDK receiver: %v", err)
	}
	return e
}

// Send sends Event(m) with an SDK client on the sending protocol p.
func Send(ctx context.Context, t testing.TB, p any, m *omnibus.Message) {
	t.Helper()
	client, err := cloudevents.NewClient(p)
	if err != nil {
		t.Fatal(err)
	}
	if res := client.Send(ctx, Event(t, m)); !cloudevents.IsACK(res) {
		t.Fatalf("SDK send: %v", res)
	}
}

// Deliver subscribes c to topic from its start and returns the first
// message delivered, stopping the consumer before it returns.
func Deliver(ctx context.Context, t testing.TB, c *omnibus.Client, topic string) *omnibus.Message {
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
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- k.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	transporttest.Eventually(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return got != nil },
		func() string { return "omnibus received nothing" })
	mu.Lock()
	defer mu.Unlock()
	return got
}

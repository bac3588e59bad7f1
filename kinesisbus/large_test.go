package kinesisbus_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/transporttest"
)

// TestLargestMessage: a binary body of the default MaxMessageBytes, with
// the longest partition key, is a record Kinesis takes and comes back
// whole; one byte more is refused before it is sent. (The conformance
// suite runs with a smaller max_message_bytes.)
func TestLargestMessage(t *testing.T) {
	need(t)
	t.Parallel()
	c := transporttest.Open(t, testURL(""))
	max := c.Capabilities().MaxMessageBytes
	stream := testPrefix + "largest-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if err := c.CreateTopic(ctxT(t), stream, 1); err != nil {
		t.Fatalf("CreateTopic: %v", err)
	}
	key := string(bytes.Repeat([]byte("k"), 256))
	m := &omnibus.Message{ID: "largest", Key: key}
	m.Body = make([]byte, max-len(m.ID)-len(m.Key))
	for i := range m.Body {
		m.Body[i] = byte(rand.Uint32()) // not UTF-8: base64 in the envelope
	}
	if err := c.Publish(ctxT(t), stream, m); err != nil {
		t.Fatalf("Publish of a %d-byte body (MaxMessageBytes %d): %v", len(m.Body), max, err)
	}
	over := &omnibus.Message{ID: "over", Key: key}
	over.Body = make([]byte, max-len(over.ID)-len(over.Key)+1)
	if err := c.Publish(ctxT(t), stream, over); !errors.Is(err, omnibus.ErrTooLarge) {
		t.Fatalf("Publish of one byte over MaxMessageBytes: %v, want ErrTooLarge", err)
	}
	var mu sync.Mutex
	var got []omnibus.Message // copies: a delivery is the engine's after the handler
	k, err := c.Subscribe(ctxT(t), stream, func(_ context.Context, m *omnibus.Message) error {
		mu.Lock()
		got = append(got, omnibus.Message{ID: m.ID, Key: m.Key, Body: bytes.Clone(m.Body)})
		mu.Unlock()
		return nil
	}, omnibus.StartFrom(omnibus.StartEarliest))
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = k.Close() })
	stop := transporttest.RunConsumer(t, k)
	transporttest.Eventually(t, 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	}, func() string { return "the largest message never arrived" })
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].ID != m.ID || got[0].Key != key || !bytes.Equal(got[0].Body, m.Body) { // got has one at least
		t.Errorf("got %d messages, the first %q key %d bytes body %d bytes; want %q whole (key 256, body %d bytes)",
			len(got), got[0].ID, len(got[0].Key), len(got[0].Body), m.ID, len(m.Body))
	}
}

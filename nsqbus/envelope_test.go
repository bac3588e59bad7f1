package nsqbus

import (
	"bytes"
	"maps"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// TestEnvelopeRoundTrip: what encode writes, decode reads back, for
// every field, headers that are attributes and headers that are not,
// and bodies of every shape.
func TestEnvelopeRoundTrip(t *testing.T) {
	when := time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC)
	for name, m := range map[string]driver.Message{
		"full": {ID: "id-1", Key: "customer-42", Type: "order.created", Source: "/omnibus/test", Time: when, ContentType: "application/json",
			Headers: map[string]string{"a": "1", "trace-id": "abc def", "unicode": "é✓", "quote": `say "hi"\`, "omnibusheaders": "x", "data": "d"},
			Body:    []byte(`{"order":1}`)},
		"binary":      {ID: "id-2", Body: []byte{0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28, 0x00}},
		"empty":       {ID: "id-3"},
		"text":        {ID: "id-4", ContentType: "text/plain", Body: []byte("line\n\r\n\x00")},
		"bad json":    {ID: "id-5", ContentType: "application/json", Body: []byte(`{"order":`)},
		"control key": {ID: "id-6\x01", Headers: map[string]string{"k\n": "v\t"}},
	} {
		t.Run(name, func(t *testing.T) {
			raw := encode(nil, &m)
			var got driver.Message
			if !decode(raw, &got) {
				t.Fatalf("decode(%s) = false", raw)
			}
			if got.ID != m.ID || got.Key != m.Key || got.Type != m.Type || got.Source != m.Source || !got.Time.Equal(m.Time) ||
				got.ContentType != m.ContentType || !bytes.Equal(got.Body, m.Body) || !maps.Equal(got.Headers, m.Headers) {
				t.Errorf("round trip of %s:\n got %+v\nwant %+v", raw, got, m)
			}
		})
	}
}

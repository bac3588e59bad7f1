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

// TestDecodeNotCloudEvent: bodies that are no JSON event of
// specversion 1.0 are not taken for one.
func TestDecodeNotCloudEvent(t *testing.T) {
	for _, body := range []string{
		``, `hello`, `{}`, `[1,2]`, `{"specversion":"0.3","id":"x"}`, `{"id":"x"}`,
		`{"specversion":"1.0","id":"x"`, `{"specversion":"1.0","id":"x\"}`, `{"specversion":"1.0","data_base64":"!!"}`,
		`{"specversion":"1.0"} trailing`, `{"specversion":"1.0","data":{"a":[1,"}"]}`,
	} {
		var m driver.Message
		if decode([]byte(body), &m) {
			t.Errorf("decode(%q) = true, %+v; want false", body, m)
		}
	}
}

// TestDecodeForeign reads JSON events as other producers write them:
// escapes, whitespace, non-string attributes, data of every kind.
func TestDecodeForeign(t *testing.T) {
	body := ` { "specversion" : "1.0", "id":"a\"b", "type":"t\u00e9", "count": 3, "flag": true, "nothing": null,
		"nested": {"x": "}"}, "datacontenttype": "text/plain", "data": "text\nbody" } `
	var m driver.Message
	if !decode([]byte(body), &m) {
		t.Fatalf("decode(%s) = false", body)
	}
	if m.ID != `a"b` || m.Type != "té" || m.Headers["count"] != "3" || m.Headers["flag"] != "true" || string(m.Body) != "text\nbody" || m.ContentType != "text/plain" {
		t.Errorf("got %+v", m)
	}
	if _, ok := m.Headers["nested"]; ok {
		t.Errorf("an object attribute became header %q", m.Headers["nested"])
	}
	m = driver.Message{}
	if !decode([]byte(`{"specversion":"1.0","id":"j","data":{"a":1}}`), &m) || string(m.Body) != `{"a":1}` || m.ContentType != "application/json" {
		t.Errorf("JSON data without datacontenttype: got %+v, want the object as body, application/json", m)
	}
}

package driver_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

var bindings = []*driver.Binding{driver.KafkaBinding, driver.NATSBinding, driver.AMQPBinding}

// FuzzBinding: for every binding, decoding any headers never panics, and
// the headers Encode writes for a message decode to that message. (The
// AMQP binding's content type is the transport's property, not a header:
// the transport carries it.)
func FuzzBinding(f *testing.F) {
	fuzztest.SeedMessages(f)
	f.Fuzz(func(t *testing.T, id, key, typ, source, contentType string, nanos int64, hs string, body []byte) {
		for _, b := range bindings {
			var any driver.Message
			for _, h := range fuzztest.Headers(hs) {
				b.Decode(&any, h[0], h[1])
			}

			m := fuzztest.Message(id, key, typ, source, contentType, nanos, hs, body)
			got := &driver.Message{Body: m.Body}
			b.Encode(m, func(name, value string) { b.Decode(got, name, value) })
			if b == driver.AMQPBinding {
				got.ContentType = m.ContentType
			}
			fuzztest.Same(t, m, got)
		}
	})
}

// FuzzDecodeStructured: decoding any body as a structured CloudEvent
// never panics, and a JSON event made of a message's fields, extensions
// and data (as data_base64, as a JSON value, or as a string) decodes to
// that message.
func FuzzDecodeStructured(f *testing.F) {
	f.Add("id-1", "order.created", "/shop", "application/json", int64(1764756672123456789), "tenant=acme\nsubject=x", []byte(`{"total": 42}`), false)
	f.Add("id-2", "t", "s", "text/plain", int64(0), "", []byte("plain text"), false)
	f.Add("id-3", "t", "s", "", int64(1), "n=1", []byte{0xff, 0}, true)
	f.Add("id-4", "", "", "application/xml", int64(-5), "trace-id=no\ndata=no", []byte("<a/>"), false)
	f.Fuzz(func(t *testing.T, id, typ, source, contentType string, nanos int64, hs string, data []byte, b64 bool) {
		_ = driver.DecodeStructured(&driver.Message{Body: data, ContentType: "application/cloudevents+json"})

		want := fuzztest.Message(id, "", typ, source, contentType, nanos, hs, data)
		ev := map[string]any{"specversion": driver.SpecVersion, "id": want.ID}
		for name, v := range map[string]string{"type": typ, "source": source, "datacontenttype": want.ContentType} {
			if v != "" {
				ev[name] = v
			}
		}
		if !want.Time.IsZero() {
			ev["time"] = want.Time.Format(time.RFC3339Nano)
		}
		for name, v := range want.Headers {
			if !driver.IsExtension(name) {
				delete(want.Headers, name) // no attribute: a structured event cannot carry it
				continue
			}
			ev[name] = v
		}
		var compact bytes.Buffer
		switch {
		case b64 || !utf8.Valid(data):
			ev["data_base64"] = base64.StdEncoding.EncodeToString(data)
		case json.Compact(&compact, data) == nil && (want.ContentType == "" || jsonType(want.ContentType)):
			ev["data"] = json.RawMessage(compact.Bytes())
			want.Body = compact.Bytes()
			if want.ContentType == "" {
				want.ContentType = "application/json" // as the event format says
			}
		default:
			ev["data"] = string(data)
			if want.ContentType == "" {
				want.ContentType = "application/json" // as the event format says
			}
			if jsonType(want.ContentType) {
				want.Body = mustJSON(t, string(data)) // JSON data that is a string
			}
		}
		for _, s := range []string{id, typ, source, contentType, hs} {
			if !utf8.ValidString(s) {
				return // JSON strings are UTF-8
			}
		}
		got := &driver.Message{Body: mustJSON(t, ev), ContentType: "application/cloudevents+json"}
		if err := driver.DecodeStructured(got); err != nil {
			t.Fatalf("DecodeStructured(%s): %v", got.Body, err)
		}
		if len(want.Headers) == 0 {
			want.Headers = nil
		}
		fuzztest.Same(t, want, got)
	})
}

// mustJSON is v in JSON, without the HTML escaping json.Marshal does, so
// that raw JSON in it stays as it was.
func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// jsonType is the event format's rule for JSON data: application/json,
// text/json or a +json suffix.
func jsonType(contentType string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(contentType), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

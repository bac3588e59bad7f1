package driver_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Every header a client may publish comes back under its name, on every
// binding, whether it travels as an extension or as a header of its own.
func TestBindingRoundTrip(t *testing.T) {
	m := &driver.Message{
		ID: "id-1", Key: "k", Type: "order.created", Source: "/shop", ContentType: "application/json",
		Time: time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC),
		Headers: map[string]string{
			"tenant": "acme", "subject": "s", "a1": "x", // extensions and an attribute without a field
			"trace-id": "t", "Tenant": "upper", "type": "not the type", "data": "d", "X-1": "y", // headers
		},
	}
	for name, b := range map[string]*driver.Binding{"kafka": driver.KafkaBinding, "nats": driver.NATSBinding, "amqp": driver.AMQPBinding} {
		t.Run(name, func(t *testing.T) {
			wire := map[string]string{}
			b.Encode(m, func(k, v string) {
				if _, dup := wire[k]; dup {
					t.Errorf("header %q written twice", k)
				}
				wire[k] = v
			})
			for _, k := range []string{"tenant", "subject", "a1"} {
				if wire[b.Prefix()+k] != m.Headers[k] {
					t.Errorf("header %q: not the extension %q (wire: %v)", k, b.Prefix()+k, wire)
				}
			}
			var got driver.Message
			if b == driver.AMQPBinding {
				got.ContentType = m.ContentType // a property on AMQP
			}
			for k, v := range wire {
				b.Decode(&got, k, v)
			}
			got.Body = m.Body
			if got.ID != m.ID || got.Key != m.Key || got.Type != m.Type || got.Source != m.Source ||
				got.ContentType != m.ContentType || !got.Time.Equal(m.Time) || !maps.Equal(got.Headers, m.Headers) {
				t.Errorf("decoded %+v\nwant    %+v\nwire %v", got, *m, wire)
			}
		})
	}
}

// EncodeAppend writes what Encode does, in the same order, each value
// where it was appended even after the buffer grew.
func TestBindingEncodeAppend(t *testing.T) {
	m := &driver.Message{
		ID: "id-1", Key: "k", Type: "order.created", ContentType: "application/json",
		Time:    time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC),
		Headers: map[string]string{"tenant": "acme", "trace-id": "t"},
	}
	var want, got [][2]string
	driver.KafkaBinding.Encode(m, func(k, v string) { want = append(want, [2]string{k, v}) })
	var values [][]byte
	var names []string
	buf := driver.KafkaBinding.EncodeAppend(make([]byte, 0, 4), m, func(k string, v []byte) {
		names = append(names, k)
		values = append(values, v)
	})
	for i, v := range values {
		if cap(v) != len(v) {
			t.Errorf("value %q: capacity %d past its end", v, cap(v))
		}
		got = append(got, [2]string{names[i], string(v)})
	}
	if len(got) != len(want) || len(buf) == 0 {
		t.Fatalf("EncodeAppend wrote %q (buffer %q), Encode %q", got, buf, want)
	}
	slices.SortFunc(got, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	slices.SortFunc(want, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	if !slices.Equal(got, want) {
		t.Errorf("EncodeAppend wrote %q, Encode %q", got, want)
	}
}

func TestBindingDecode(t *testing.T) {
	var m driver.Message
	b := driver.KafkaBinding
	for _, h := range [][2]string{
		{"tenant", "plain"}, {"CE_Tenant", "ext"}, // the extension wins, whatever the order
		{"ce_region", "ext"}, {"region", "plain"},
		{"ce_trace-id", "x"}, {"ce_", "x"}, // no attribute names: dropped
		{"Content-Type", "text/plain"}, {"ce_time", "yesterday"},
	} {
		b.Decode(&m, h[0], h[1])
	}
	want := map[string]string{"tenant": "ext", "region": "ext"}
	if !maps.Equal(m.Headers, want) || m.ContentType != "text/plain" || !m.Time.IsZero() {
		t.Errorf("headers %v content type %q time %v; want %v, text/plain, zero", m.Headers, m.ContentType, m.Time, want)
	}
}

func TestReservedHeader(t *testing.T) {
	for name, want := range map[string]bool{
		"content-type": true, "Content-Type": true, "ce_x": true, "CE-Id": true, "cloudEvents:id": true, "cloudevents_x": true, "ce_": true,
		"tenant": false, "trace-id": false, "ce": false, "cex": false, "content-typ": false, "cloudEvents": false,
	} {
		if got := driver.ReservedHeader(name); got != want {
			t.Errorf("ReservedHeader(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestDecodeStructured(t *testing.T) {
	when := time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC)
	for _, tt := range []struct {
		name, body  string
		contentType string // of the delivered message
		body2       string // its Body
		headers     map[string]string
	}{
		{"json data", `{"specversion":"1.0","id":"1","type":"t","source":"/s","time":"2026-12-02T10:11:12.123456789Z",` +
			`"partitionkey":"k","tenant":"acme","n":7,"ok":true,"obj":{"a":1},"data":{"total": 42}}`,
			"application/json", `{"total": 42}`, map[string]string{"tenant": "acme", "n": "7", "ok": "true", "keep": "x"}},
		{"text data", `{"specversion":"1.0","id":"1","type":"t","source":"/s","time":"2026-12-02T10:11:12.123456789Z",` +
			`"partitionkey":"k","datacontenttype":"text/plain","data":"hello"}`, "text/plain", "hello", map[string]string{"keep": "x"}},
		{"base64 data", `{"specversion":"1.0","id":"1","type":"t","source":"/s","time":"2026-12-02T10:11:12.123456789Z",` +
			`"partitionkey":"k","datacontenttype":"application/octet-stream","data_base64":"AAH/"}`, "application/octet-stream", "\x00\x01\xff", map[string]string{"keep": "x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := driver.Message{ContentType: "application/cloudevents+json; charset=utf-8", Headers: map[string]string{"keep": "x"}, Body: []byte(tt.body)}
			if !driver.Structured(m.ContentType) {
				t.Fatalf("Structured(%q) = false", m.ContentType)
			}
			if err := driver.DecodeStructured(&m); err != nil {
				t.Fatal(err)
			}
			if m.ID != "1" || m.Type != "t" || m.Source != "/s" || m.Key != "k" || !m.Time.Equal(when) ||
				m.ContentType != tt.contentType || string(m.Body) != tt.body2 || !maps.Equal(m.Headers, tt.headers) {
				t.Errorf("decoded %+v\nwant content type %q body %q headers %v", m, tt.contentType, tt.body2, tt.headers)
			}
		})
	}
	for _, body := range []string{`not json`, `{"specversion":"0.3","id":"1"}`, `{"id":"1"}`, `{"specversion":"1.0","data_base64":"%%"}`} {
		m := driver.Message{ContentType: "application/cloudevents+json", Body: []byte(body)}
		if err := driver.DecodeStructured(&m); err == nil || string(m.Body) != body || m.ContentType != "application/cloudevents+json" {
			t.Errorf("%s: err %v, message %+v; want an error and the message as it was", body, err, m)
		}
	}
	for ct, want := range map[string]bool{"application/cloudevents+json": true, "Application/CloudEvents+JSON;charset=utf-8": true,
		"application/cloudevents-batch+json": false, "application/cloudevents+jsonx": false, "application/json": false} {
		if got := driver.Structured(ct); got != want {
			t.Errorf("Structured(%q) = %v, want %v", ct, got, want)
		}
	}
}

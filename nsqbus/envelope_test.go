package nsqbus

import (
	"bytes"
	"encoding/binary"
	"errors"
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

// TestBatches: a Publish's messages go in MPUB bodies within nsqd's body
// size, each message framed by its size and decoding to itself; those
// over the message size are left out, with ErrTooLarge.
func TestBatches(t *testing.T) {
	for _, bin := range []bool{false, true} {
		testBatches(t, bin)
	}
}

func testBatches(t *testing.T, bin bool) {
	c := &conn{cfg: &config{binary: bin}, limits: limits{maxMsg: 600, maxBody: 2000}}
	if bin {
		c.limits.maxMsg, c.limits.maxBody = 400, 1200 // 300 bytes fit as they are
	}
	var msgs []*driver.Message
	for i := range 12 {
		size := 300
		if i == 5 {
			size = 1000 // over maxMsg once encoded
		}
		msgs = append(msgs, &driver.Message{ID: "m" + string(rune('a'+i)), Body: bytes.Repeat([]byte{byte(i)}, size)})
	}
	errs := make([]error, len(msgs))
	var batches []*batch
	c.encodeBatches("t", msgs, errs, func(b *batch) { batches = append(batches, b) })
	seen := 0
	for _, b := range batches {
		if len(b.body) > c.limits.maxBody {
			t.Errorf("an MPUB body of %d bytes, over %d", len(b.body), c.limits.maxBody)
		}
		b.command("t") // writes the count
		if n := int(binary.BigEndian.Uint32(b.body)); n != len(b.idx) {
			t.Errorf("count %d, want %d", n, len(b.idx))
		}
		for j, i := range b.idx {
			if size := int(binary.BigEndian.Uint32(b.body[b.offs[j]-4:])); size != len(b.msg(j)) {
				t.Errorf("message %d framed as %d bytes, is %d", i, size, len(b.msg(j)))
			}
			var got driver.Message
			dec := decode
			if bin {
				dec = decodeBinary
			}
			if !dec(b.msg(j), &got) || got.ID != msgs[i].ID || !bytes.Equal(got.Body, msgs[i].Body) {
				t.Errorf("message %d decodes to %+v", i, got)
			}
			seen++
		}
	}
	if seen != 11 || !errors.Is(errs[5], driver.ErrTooLarge) || len(batches) < 3 {
		t.Errorf("binary %v: %d messages in %d batches, error of the large one %v; want 11, several batches, ErrTooLarge", bin, seen, len(batches), errs[5])
	}
}

// TestEnvelopeTextBody: a text body travels as a JSON string where that
// is no larger than base64, and in base64 where it is (escapes) or
// must be (not UTF-8); both read back the same.
func TestEnvelopeTextBody(t *testing.T) {
	for body, member := range map[string]string{
		"plain text, é✓":                   `"data":"plain text, é✓"`,
		"<b>&amp;</b>":                     `"data":`,
		"\x00\x01\x02\x03\x04\x05\x06\x07": `"data_base64":`,
		"\xff\xfe not UTF-8":               `"data_base64":`,
	} {
		m := driver.Message{ID: "t", ContentType: "text/plain; charset=utf-8", Body: []byte(body)}
		raw := encode(nil, &m)
		if !bytes.Contains(raw, []byte(member)) {
			t.Errorf("body %q encoded as %s, want %s", body, raw, member)
		}
		var got driver.Message
		if !decode(raw, &got) || !bytes.Equal(got.Body, m.Body) || got.ContentType != m.ContentType {
			t.Errorf("round trip of %s: %+v", raw, got)
		}
	}
}

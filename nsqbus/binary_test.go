package nsqbus

import (
	"bytes"
	"maps"
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// TestBinaryRoundTrip: what encodeBinary writes, decodeBinary reads
// back, for every field, headers of any name, and bodies of every
// shape; neither envelope's reader takes the other's.
func TestBinaryRoundTrip(t *testing.T) {
	when := time.Date(2026, 12, 2, 10, 11, 12, 123456789, time.UTC)
	for name, m := range map[string]driver.Message{
		"full": {ID: "id-1", Key: "customer-42", Type: "order.created", Source: "/omnibus/test", Time: when, ContentType: "application/json",
			Headers: map[string]string{"a": "1", "trace-id": "abc def", "unicode": "é✓", "quote": `say "hi"\`, "omnibusheaders": "x", "data": "d", "": ""},
			Body:    []byte(`{"order":1}`)},
		"binary":      {ID: "id-2", Body: []byte{0xff, 0xfe, 0x00, 0x80, 0xc3, 0x28, 0x00}},
		"empty":       {ID: "id-3"},
		"no id":       {Body: []byte("x")},
		"text":        {ID: "id-4", ContentType: "text/plain", Body: []byte("line\n\r\n\x00")},
		"long":        {ID: string(bytes.Repeat([]byte("i"), 300)), Time: time.Unix(-5, 7).UTC(), Body: bytes.Repeat([]byte{0}, 70000)},
		"magic body":  {ID: "id-5", Body: []byte(binMagic + "\x00")},
		"control key": {ID: "id-6\x01", Headers: map[string]string{"k\n": "v\t"}},
	} {
		t.Run(name, func(t *testing.T) {
			raw := encodeBinary(nil, &m)
			var got driver.Message
			if !decodeBinary(raw, &got) {
				t.Fatalf("decodeBinary(%q) = false", raw)
			}
			if got.ID != m.ID || got.Key != m.Key || got.Type != m.Type || got.Source != m.Source || !got.Time.Equal(m.Time) ||
				got.ContentType != m.ContentType || !bytes.Equal(got.Body, m.Body) || !maps.Equal(got.Headers, m.Headers) {
				t.Errorf("round trip of %q:\n got %+v\nwant %+v", raw, got, m)
			}
			if decode(raw, &got) {
				t.Errorf("the JSON reader took a binary envelope")
			}
			if decodeBinary(encode(nil, &m), &got) {
				t.Errorf("the binary reader took a JSON event")
			}
		})
	}
}

// TestBinaryTimeOutOfRange: a time Unix nanoseconds cannot hold is left
// out, not wrapped into another.
func TestBinaryTimeOutOfRange(t *testing.T) {
	for _, at := range []time.Time{time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)} {
		var got driver.Message
		if !decodeBinary(encodeBinary(nil, &driver.Message{ID: "x", Time: at}), &got) || !got.Time.IsZero() {
			t.Errorf("time %v came back as %v; want none", at, got.Time)
		}
	}
}

// TestDecodeBinaryNotEnvelope: bodies that are no binary envelope, a
// valid one cut short or changed in its attributes among them, are not
// taken for one.
func TestDecodeBinaryNotEnvelope(t *testing.T) {
	valid := encodeBinary(nil, &driver.Message{ID: "id", Type: "t", Time: time.Now(), Headers: map[string]string{"h": "v"}, Body: []byte("body")})
	end := bytes.LastIndex(valid, []byte("body")) - 1 // the end tag
	bodies := [][]byte{nil, []byte("hello"), []byte(`{"specversion":"1.0"}`), []byte("\x00OMB"), []byte("\x00OMB\x02\x00"), []byte("\x01OMB\x01\x00")}
	for n := range end + 1 {
		bodies = append(bodies, valid[:n]) // cut before the end tag
	}
	bodies = append(bodies,
		[]byte(binMagic+"\x01\x05ab"),                                            // a length beyond the body
		[]byte(binMagic+"\x01\x01a\x01\x01b\x00"),                                // an attribute twice
		[]byte(binMagic+"\x09\x00"),                                              // an unknown tag
		[]byte(binMagic+"\x06\x00\x00\x00\x00\x00"),                              // a time cut short
		[]byte(binMagic+"\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01a\x00"), // a length that overflows
	)
	for _, body := range bodies {
		var m driver.Message
		if decodeBinary(body, &m) {
			t.Errorf("decodeBinary(%q) = true, %+v; want false", body, m)
		}
	}
}

// TestBinarySize: the binary envelope of a small binary message is a
// little over its body, where the JSON event is more than twice it.
func TestBinarySize(t *testing.T) {
	m := driver.Message{ID: "3c17fdf3cbf721c0c2-1", Time: time.Now(), Body: make([]byte, 100)}
	bin, js := len(encodeBinary(nil, &m)), len(encode(nil, &m))
	if bin > 140 || js < 230 {
		t.Errorf("100-byte body: binary envelope %d bytes, JSON %d", bin, js)
	}
}

package nsqbus

// Messages on the wire: NSQ carries a body and nothing else, so a
// message travels as a CloudEvent in the JSON event format (structured
// content mode). Encoding and decoding are written out by hand: they run
// once per message, and encoding/json's reflection and its map of raw
// members cost more than the rest of a consume. Pure functions, safe for
// concurrent use.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/omnibus-go/omnibus/driver"
)

// ContentTypeCloudEvents is the content type of the envelope (NSQ has no
// field for it; it is what a reader of the topic finds in every body).
const ContentTypeCloudEvents = "application/cloudevents+json"

// headersAttr is the extension attribute carrying the headers whose
// names cannot be attributes ("trace-id", "X-Request-Id"), as a JSON
// object in a string: a JSON event's members are attributes, and a
// CloudEvents reader refuses an event with a member named otherwise.
const headersAttr = "omnibusheaders"

// encode appends m as a JSON event to dst: specversion, id, source,
// type, time, partitionkey (the key), datacontenttype, one extension per
// header named as an attribute, headersAttr for the others, and the body
// (encodeBody). Attributes that are empty are left out.
func encode(dst []byte, m *driver.Message) []byte {
	dst = append(dst, `{"specversion":"1.0","id":`...)
	dst = appendString(dst, m.ID)
	for _, a := range [...]struct{ name, value string }{
		{`,"source":`, m.Source}, {`,"type":`, m.Type}, {`,"partitionkey":`, m.Key}, {`,"datacontenttype":`, m.ContentType},
	} {
		if a.value != "" {
			dst = append(dst, a.name...)
			dst = appendString(dst, a.value)
		}
	}
	if !m.Time.IsZero() {
		dst = append(dst, `,"time":"`...)
		dst = driver.AppendTime(dst, m.Time)
		dst = append(dst, '"')
	}
	var other map[string]string
	for k, v := range m.Headers {
		if driver.IsExtension(k) && k != headersAttr {
			dst = append(dst, ',')
			dst = appendString(dst, k)
			dst = append(dst, ':')
			dst = appendString(dst, v)
			continue
		}
		if other == nil {
			other = make(map[string]string)
		}
		other[k] = v
	}
	if other != nil {
		raw, _ := json.Marshal(other) // a map of strings always marshals
		dst = append(dst, `,"`+headersAttr+`":`...)
		dst = appendString(dst, string(raw))
	}
	return append(encodeBody(dst, m), '}')
}

// encodeBody appends the body, the smallest way the content type
// allows: none when empty; as data, the JSON itself, when it is valid
// JSON of a JSON content type; as data, a JSON string, when it is text
// (text/*) in UTF-8 no longer escaped than in base64; else as
// data_base64.
func encodeBody(dst []byte, m *driver.Message) []byte {
	switch {
	case len(m.Body) == 0:
		return dst
	case jsonType(m.ContentType) && json.Valid(m.Body):
		dst = append(dst, `,"data":`...)
		return append(dst, m.Body...)
	case textType(m.ContentType) && utf8.Valid(m.Body):
		start := len(dst)
		dst = append(dst, `,"data":`...)
		dst = appendString(dst, unsafeString(m.Body))
		if len(dst)-start <= len(`,"data_base64":""`)+base64.StdEncoding.EncodedLen(len(m.Body)) {
			return dst
		}
		dst = dst[:start] // escaped, it is larger than in base64
	}
	dst = append(dst, `,"data_base64":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, m.Body)
	return append(dst, '"')
}

// unsafeString is b as a string without a copy, for reading only while
// b is not changed.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// appendString appends s as a JSON string. A string with nothing to
// escape, the usual case, is copied as it is.
func appendString(dst []byte, s string) []byte {
	high := false
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			return appendMarshaled(dst, s)
		} else if c >= utf8.RuneSelf {
			high = true
		}
	}
	if high && !utf8.ValidString(s) {
		return appendMarshaled(dst, s) // invalid UTF-8 becomes U+FFFD, as JSON needs
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func appendMarshaled(dst []byte, s string) []byte {
	raw, _ := json.Marshal(s) // a string always marshals
	return append(dst, raw...)
}

// textType reports whether a media type is text (text/*) other than
// JSON.
func textType(contentType string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(contentType), ";")
	mt = strings.TrimSpace(mt)
	return strings.HasPrefix(mt, "text/") && mt != "text/json"
}

// jsonType reports whether a media type is JSON (application/json,
// text/json or a +json suffix).
func jsonType(contentType string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(contentType), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// member is one member of a JSON object as the scanner found it.
type member struct {
	key   []byte // unquoted when it had no escapes, else the raw token
	value []byte // the raw token
	kind  byte   // '"' string, '{' structure (object or array), 'l' literal (number, true, false, null)
	kesc  bool   // the key holds escapes
	esc   bool   // the value, a string, holds escapes
}

// decode takes body into m when it is a JSON event of specversion 1.0,
// as driver.DecodeStructured reads one: attributes set the fields and
// the headers, headersAttr the other headers, data or data_base64 the
// body. It reports false, leaving m as it was, for any other body: a
// producer that does not speak CloudEvents.
func decode(body []byte, m *driver.Message) bool {
	var buf [16]member
	members, ok := scanObject(body, buf[:0])
	if !ok {
		return false
	}
	version := false
	for _, mb := range members {
		if string(mb.key) == "specversion" && mb.kind == '"' && string(mb.value) == `"1.0"` {
			version = true
		}
	}
	if !version {
		return false
	}
	out := driver.Message{}
	var data *member
	for i := range members {
		mb := &members[i]
		key := string(mb.key)
		if mb.kesc {
			var k string
			if json.Unmarshal(mb.key, &k) != nil {
				return false
			}
			key = k
		}
		switch {
		case key == "data" || key == "data_base64":
			data = mb
			data.key = []byte(key)
		case mb.kind == '"':
			v, ok := unquote(mb)
			if !ok {
				return false
			}
			if key == headersAttr {
				var hs map[string]string
				if json.Unmarshal([]byte(v), &hs) == nil {
					for k, hv := range hs {
						if out.Headers == nil {
							out.Headers = make(map[string]string, len(hs))
						}
						out.Headers[k] = hv
					}
				}
				continue
			}
			driver.SetAttribute(&out, key, v)
		case mb.kind == 'l' && string(mb.value) != "null":
			driver.SetAttribute(&out, key, string(mb.value)) // booleans and integers in their canonical form
		}
	}
	if data != nil {
		switch {
		case string(data.key) == "data_base64":
			if data.kind != '"' || data.esc {
				return false
			}
			raw := data.value[1 : len(data.value)-1]
			b := make([]byte, base64.StdEncoding.DecodedLen(len(raw)))
			n, err := base64.StdEncoding.Decode(b, raw)
			if err != nil {
				return false
			}
			out.Body = b[:n]
		default:
			if out.ContentType == "" {
				out.ContentType = "application/json"
			}
			if data.kind == '"' && !jsonType(out.ContentType) {
				v, ok := unquote(data)
				if !ok {
					return false
				}
				out.Body = []byte(v)
			} else {
				out.Body = data.value
			}
		}
	}
	*m = out
	return true
}

// unquote returns the text of a string member's value.
func unquote(mb *member) (string, bool) {
	if !mb.esc {
		return string(mb.value[1 : len(mb.value)-1]), true
	}
	var s string
	if json.Unmarshal(mb.value, &s) != nil {
		return "", false
	}
	return s, true
}

// scanObject splits a JSON object into its members, appended to dst,
// without decoding them. It checks the structure it needs, not every
// rule of JSON: values it hands on are decoded (and so checked) by their
// readers.
func scanObject(b []byte, dst []member) ([]member, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return dst, skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		end, esc, ok := scanString(b, i)
		if !ok {
			return nil, false
		}
		mb := member{key: b[i+1 : end-1], kesc: esc}
		if esc {
			mb.key = b[i:end]
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipSpace(b, i+1)
		if i >= len(b) {
			return nil, false
		}
		start := i
		switch b[i] {
		case '"':
			end, esc, ok = scanString(b, i)
			mb.kind, mb.esc = '"', esc
		case '{', '[':
			end, ok = scanStructure(b, i)
			mb.kind = '{'
		default:
			end = i
			for end < len(b) && !strings.ContainsRune(",}] \t\r\n", rune(b[end])) {
				end++
			}
			ok = end > i
			mb.kind = 'l'
		}
		if !ok {
			return nil, false
		}
		mb.value = b[start:end]
		dst = append(dst, mb)
		i = skipSpace(b, end)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return dst, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// scanString returns the index after the string starting at b[i] (a
// quote), and whether it holds escapes. It looks for the closing quote
// with bytes.IndexByte, which is much faster than a loop over a long
// string (a body in base64).
func scanString(b []byte, i int) (end int, esc, ok bool) {
	j := i + 1
	for {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return 0, false, false
		}
		q += j
		bs := bytes.IndexByte(b[j:q], '\\')
		if bs < 0 {
			return q + 1, esc, true
		}
		esc = true
		j += bs + 2 // past the backslash and the byte it escapes
		if j > len(b) {
			return 0, false, false
		}
	}
}

// scanStructure returns the index after the object or array starting at
// b[i].
func scanStructure(b []byte, i int) (int, bool) {
	depth := 0
	for j := i; j < len(b); j++ {
		switch b[j] {
		case '"':
			end, _, ok := scanString(b, j)
			if !ok {
				return 0, false
			}
			j = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1, true
			}
		}
	}
	return 0, false
}

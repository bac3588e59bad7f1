package nsqbus

// The binary envelope (URL parameter envelope=binary): a message as a
// magic prefix, its attributes each length-prefixed, and the body as it
// is, with no base64 and no JSON. It is what makes a small binary
// message cheap: at 100 bytes the JSON event is about 2.5 times the body
// (data_base64, member names, the time as text), and nsqd's work per
// message follows its size (doc.go, "Messages on the wire"). Readers
// take both envelopes, and bodies of other producers, whatever the URL
// says. Pure functions, safe for concurrent use.
//
// Layout:
//
//	"\x00OMB" 0x01               magic and version
//	tag ...                      attributes, in any order, each once at most
//	0x00                         end of the attributes
//	body                         the rest, as it is
//
// where a tag is followed by
//
//	binID, binSource, binType,   uvarint length, bytes
//	binKey, binContentType
//	binTime                      8 bytes: Unix nanoseconds, big-endian
//	binHeader                    uvarint length, name, uvarint length, value
//
// The first byte, 0x00, starts neither JSON nor text, so a body of
// another producer is taken for this envelope only if it also has the
// magic, the version and attributes that parse to the byte; a body that
// has the magic and does not parse is delivered as it is.

import (
	"encoding/binary"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

const binMagic = "\x00OMB\x01"

const (
	binEnd byte = iota
	binID
	binSource
	binType
	binKey
	binContentType
	binTime
	binHeader
)

// minNanos and maxNanos bound the times Unix nanoseconds hold (years
// 1678 to 2262); a time outside them is left out of the envelope rather
// than wrapped (time.Time.UnixNano's result is undefined there).
var (
	minNanos = time.Unix(0, -1<<63)
	maxNanos = time.Unix(0, 1<<63-1)
)

// encodeBinary appends m in the binary envelope to dst.
func encodeBinary(dst []byte, m *driver.Message) []byte {
	dst = append(dst, binMagic...)
	for _, a := range [...]struct {
		tag   byte
		value string
	}{{binID, m.ID}, {binSource, m.Source}, {binType, m.Type}, {binKey, m.Key}, {binContentType, m.ContentType}} {
		if a.value != "" {
			dst = append(dst, a.tag)
			dst = appendBytes(dst, a.value)
		}
	}
	if !m.Time.IsZero() && !m.Time.Before(minNanos) && !m.Time.After(maxNanos) {
		dst = append(dst, binTime)
		dst = binary.BigEndian.AppendUint64(dst, uint64(m.Time.UnixNano()))
	}
	for k, v := range m.Headers {
		dst = append(dst, binHeader)
		dst = appendBytes(dst, k)
		dst = appendBytes(dst, v)
	}
	dst = append(dst, binEnd)
	return append(dst, m.Body...)
}

func appendBytes(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// decodeBinary takes body into m when it is a binary envelope. It
// reports false, leaving m as it was, for anything else. The body is
// m's without a copy (go-nsq made it for this message alone).
func decodeBinary(body []byte, m *driver.Message) bool {
	if len(body) < len(binMagic) || string(body[:len(binMagic)]) != binMagic {
		return false
	}
	b := body[len(binMagic):]
	out := driver.Message{}
	var seen uint16 // the tags read, each once at most (headers aside)
	for {
		if len(b) == 0 {
			return false
		}
		tag := b[0]
		b = b[1:]
		if tag != binHeader {
			if tag > binHeader || seen&(1<<tag) != 0 {
				return false
			}
			seen |= 1 << tag
		}
		switch tag {
		case binEnd:
			out.Body = b
			*m = out
			return true
		case binTime:
			if len(b) < 8 {
				return false
			}
			out.Time = time.Unix(0, int64(binary.BigEndian.Uint64(b))).UTC()
			b = b[8:]
		case binHeader:
			k, rest, ok := readBytes(b)
			if !ok {
				return false
			}
			v, rest, ok := readBytes(rest)
			if !ok {
				return false
			}
			if out.Headers == nil {
				out.Headers = make(map[string]string)
			}
			out.Headers[k] = v
			b = rest
		default:
			v, rest, ok := readBytes(b)
			if !ok {
				return false
			}
			switch tag {
			case binID:
				out.ID = v
			case binSource:
				out.Source = v
			case binType:
				out.Type = v
			case binKey:
				out.Key = v
			case binContentType:
				out.ContentType = v
			}
			b = rest
		}
	}
}

// readBytes reads a uvarint length and that many bytes, as a string.
func readBytes(b []byte) (string, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return "", nil, false
	}
	end := k + int(n)
	return string(b[k:end]), b[end:], true
}

package redisbus

// The wire: a message as the fields of a stream entry, and back. The
// fields follow the CloudEvents binary content mode as the Kafka
// protocol binding spells it (driver.KafkaBinding: ce_id, ce_type, ...,
// content-type), with the body in the field "data". It runs on the
// caller's goroutine and keeps no state.

import (
	"fmt"
	"unsafe"

	"github.com/omnibus-go/omnibus/driver"
)

// bodyField is the field that holds a message's body.
const bodyField = "data"

var binding = driver.KafkaBinding

// checkHeaders refuses the header names a message cannot carry: the
// binding's own (ce_*, content-type) and the body's field.
func checkHeaders(m *driver.Message) error {
	for k := range m.Headers {
		if driver.ReservedHeader(k) || k == bodyField {
			return fmt.Errorf("header %q: the name belongs to the wire format (ce_*, content-type, %s): %w", k, bodyField, driver.ErrInvalid)
		}
	}
	return nil
}

// xadd returns the command that appends m to stream: XADD stream * and
// m's fields, body last.
func xadd(stream string, m *driver.Message) []any {
	args := make([]any, 3, 3+2*(len(m.Headers)+7))
	args[0], args[1], args[2] = "xadd", stream, "*"
	binding.Encode(m, func(name, value string) { args = append(args, name, value) })
	return append(args, bodyField, m.Body)
}

// decode makes a delivery of the entry id of lane l into d. A field
// other than the body and the binding's is a header; an entry without
// ce_id (written by another client) takes the entry ID as its message ID.
func decode(d *driver.Delivery, l *lane, id string, fields map[string]any, attempt int) {
	*d = driver.Delivery{Lane: l.id, Position: id, Attempt: attempt, Token: l}
	for k, v := range fields {
		s, _ := v.(string)
		decodeField(d, k, s)
	}
	if d.ID == "" {
		d.ID = id
	}
}

// decodePairs is decode for an entry's fields as a flat list (a
// script's reply). A field given twice takes its last value, as in the
// map go-redis makes of a read's reply.
func decodePairs(l *lane, id string, pairs []any, attempt int) *driver.Delivery {
	d := &driver.Delivery{Lane: l.id, Position: id, Attempt: attempt, Token: l}
	for i := 0; i+1 < len(pairs); i += 2 {
		if k, ok := pairs[i].(string); ok {
			s, _ := pairs[i+1].(string)
			decodeField(d, k, s)
		}
	}
	if d.ID == "" {
		d.ID = id
	}
	return d
}

// decodeField sets what field k of value s says in d.
func decodeField(d *driver.Delivery, k, s string) {
	if k == bodyField {
		d.Body = replyBytes(s)
		return
	}
	binding.Decode(&d.Message, k, s)
}

// replyBytes returns a string of a go-redis reply as bytes. A bulk
// string of a reply (every field of a stream entry) is a buffer go-redis
// made for it alone and no one else holds (proto.Reader's
// readStringReply), so a long one is handed on as it is: copying the
// body of every message read was a tenth of a consume's processor time.
// Short ones are copied, since go-redis turns an integer reply into a
// string with strconv, whose small numbers are constants.
func replyBytes(s string) []byte {
	if len(s) <= 16 {
		return []byte(s)
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

package driver

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"
)

// SpecVersion is the CloudEvents version the transports write.
const SpecVersion = "1.0"

// headerContentType is the header that carries the content type in the
// Kafka binding, and that other producers use on NATS.
const headerContentType = "content-type"

// Binding is one CloudEvents protocol binding's spelling of binary content
// mode: the prefix of its attribute headers and where the content type
// goes. The mapping is the same on every transport with headers; only the
// spelling differs:
//
//   - ID, Type, Source, Time and ContentType are the attributes id, type,
//     source, time (RFC 3339 with nanoseconds) and datacontenttype;
//     specversion is 1.0; Key is the partitioning extension's
//     partitionkey (and the transport's own key where it has one).
//   - A header whose name is a CloudEvents attribute name (lowercase
//     ASCII letters and digits) that no field above uses is the extension
//     attribute of that name: the header "tenant" travels as the
//     extension tenant. Every attribute a message arrives with that no
//     field takes (an extension, subject, dataschema) is delivered as the
//     header of its name, whoever wrote it.
//   - Any other header ("trace-id", "X-Request-Id", "type") cannot be an
//     attribute: it travels under its own name, outside the binding's
//     prefix, and is delivered as it is; CloudEvents readers ignore it.
//
// Header names that a binding uses for itself (see [ReservedHeader]) are
// refused on publish, so every header a client publishes arrives under
// the name it was given. Messages in structured content mode are read
// with [DecodeStructured].
type Binding struct {
	prefixes    []string // the first is written; all are read, in any case
	contentType string   // the header ContentType is written to; "" when the transport has a field for it
	names       [7]string
}

// The bindings omnibus follows.
var (
	// KafkaBinding is the Kafka protocol binding: ce_id, ce_type, ...;
	// the content type in the content-type header.
	KafkaBinding = newBinding([]string{"ce_"}, headerContentType)
	// NATSBinding is the NATS protocol binding: ce-id, ce-type, ...,
	// ce-datacontenttype. Its names are read in any case, so the Ce-Id
	// spelling of omnibus before the binding existed is read too.
	NATSBinding = newBinding([]string{"ce-"}, "ce-datacontenttype")
	// AMQPBinding is the AMQP protocol binding: application properties
	// cloudEvents:id, cloudEvents:type, ... (and cloudEvents_id, the
	// spelling JMS clients need, on read); the content type goes in the
	// message's content-type property, which the transport sets.
	AMQPBinding = newBinding([]string{"cloudEvents:", "cloudEvents_"}, "")
)

// attribute names, in the order Encode writes them.
const (
	attrSpecVersion = iota
	attrID
	attrType
	attrSource
	attrTime
	attrDataContentType
	attrPartitionKey
)

var attrNames = [...]string{"specversion", "id", "type", "source", "time", "datacontenttype", "partitionkey"}

func newBinding(prefixes []string, contentType string) *Binding {
	b := &Binding{prefixes: prefixes, contentType: contentType}
	for i, a := range attrNames {
		b.names[i] = prefixes[0] + a
	}
	return b
}

// Prefix is the prefix the binding writes attribute names with.
func (b *Binding) Prefix() string { return b.prefixes[0] }

// Encode calls set with the name and value of every header m travels
// with: specversion, the attributes of m's fields that are set (the
// content type only where the binding puts it in a header), the
// extensions and the other headers. The transport keeps Key, Body and
// (where it has fields for them) the content type in its own fields too.
func (b *Binding) Encode(m *Message, set func(name, value string)) {
	b.encode(m, set, func(name string, t time.Time) { set(name, FormatTime(t)) })
}

// EncodeAppend is Encode for a transport that keeps every header value
// in one buffer: it appends each value to buf and calls set with the
// name and the value as it lies in buf (its capacity ends with it, so it
// stays put when buf grows later), and returns buf. The time is appended
// in place: no string made for it (one allocation a message fewer).
func (b *Binding) EncodeAppend(buf []byte, m *Message, set func(name string, value []byte)) []byte {
	value := func(at int) []byte { return buf[at:len(buf):len(buf)] }
	b.encode(m, func(name, v string) {
		at := len(buf)
		buf = append(buf, v...)
		set(name, value(at))
	}, func(name string, t time.Time) {
		at := len(buf)
		buf = AppendTime(buf, t)
		set(name, value(at))
	})
	return buf
}

// encode is Encode with the time given to setTime.
func (b *Binding) encode(m *Message, set func(name, value string), setTime func(name string, t time.Time)) {
	set(b.names[attrSpecVersion], SpecVersion)
	set(b.names[attrID], m.ID)
	for i, v := range [...]string{attrType: m.Type, attrSource: m.Source, attrPartitionKey: m.Key} {
		if v != "" {
			set(b.names[i], v)
		}
	}
	if !m.Time.IsZero() {
		setTime(b.names[attrTime], m.Time)
	}
	if m.ContentType != "" && b.contentType != "" {
		set(b.contentType, m.ContentType)
	}
	for k, v := range m.Headers {
		if IsExtension(k) {
			set(b.prefixes[0]+k, v)
		} else {
			set(k, v)
		}
	}
}

// Decode takes the header name: value of a received message into m: an
// attribute sets its field, an extension (or an attribute without a
// field) goes to Headers under its name, a content-type header sets
// ContentType unless it is set, and any other header goes to Headers as
// it is unless an attribute of that name is there. An attribute whose
// name is not one (ce_trace-id) is dropped: no CloudEvents producer can
// have meant it. A time that does not parse is ignored.
func (b *Binding) Decode(m *Message, name, value string) {
	for i := range b.names { // the names as the binding writes them: most headers
		if name == b.names[i] {
			setAttribute(m, attrNames[i], value)
			return
		}
	}
	attr, ok := b.attribute(name)
	if !ok {
		if strings.EqualFold(name, headerContentType) {
			if m.ContentType == "" {
				m.ContentType = value
			}
			return
		}
		if _, dup := m.Headers[name]; !dup {
			setHeader(m, name, value)
		}
		return
	}
	setAttribute(m, attr, value)
}

// SetAttribute sets what the CloudEvents attribute name carries in m, as
// [DecodeStructured] does for each attribute of a JSON event: a field
// (id, type, source, time, datacontenttype, partitionkey), nothing
// (specversion), or the header of its name; a name that is no attribute
// name is dropped. Transports that read the JSON event format themselves
// use it.
func SetAttribute(m *Message, name, value string) { setAttribute(m, name, value) }

// setAttribute sets what the attribute attr (a lowercase name) carries in
// m: a field, or the header of its name. A name that is no attribute name
// is dropped.
func setAttribute(m *Message, attr, value string) {
	switch attr {
	case attrNames[attrSpecVersion]:
	case attrNames[attrID]:
		m.ID = value
	case attrNames[attrType]:
		m.Type = value
	case attrNames[attrSource]:
		m.Source = value
	case attrNames[attrTime]:
		if t, err := ParseTime(value); err == nil {
			m.Time = t
		}
	case attrNames[attrDataContentType]:
		m.ContentType = value
	case attrNames[attrPartitionKey]:
		m.Key = value
	default:
		if validAttribute(attr) {
			setHeader(m, attr, value)
		}
	}
}

func setHeader(m *Message, name, value string) {
	if m.Headers == nil {
		m.Headers = make(map[string]string)
	}
	m.Headers[name] = value
}

// attribute returns the attribute name, lowercased, of a header with one
// of the binding's prefixes.
func (b *Binding) attribute(name string) (string, bool) {
	for _, p := range b.prefixes {
		if len(name) >= len(p) && strings.EqualFold(name[:len(p)], p) {
			rest := name[len(p):]
			for i := 0; i < len(rest); i++ {
				if c := rest[i]; 'A' <= c && c <= 'Z' {
					return strings.ToLower(rest), true
				}
			}
			return rest, true
		}
	}
	return "", false
}

// IsExtension reports whether the header name travels as the CloudEvents
// extension attribute of that name: it is a CloudEvents attribute name
// (lowercase ASCII letters and digits; the specification recommends at
// most 20) and no field of Message uses it (id, type, source, time,
// specversion, datacontenttype, partitionkey), nor is it data.
func IsExtension(name string) bool {
	if !validAttribute(name) || name == "data" {
		return false
	}
	for _, a := range attrNames {
		if name == a {
			return false
		}
	}
	return true
}

// validAttribute reports whether name is a CloudEvents attribute name.
func validAttribute(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// ReservedHeader reports whether a header name belongs to a CloudEvents
// binding and cannot be a user header: content-type, and names starting
// with ce_, ce-, cloudEvents: or cloudEvents_, in any case. A header
// named so would arrive as something else (an attribute, the content
// type), or make CloudEvents readers refuse the message.
func ReservedHeader(name string) bool {
	if strings.EqualFold(name, headerContentType) {
		return true
	}
	for _, b := range [...]*Binding{KafkaBinding, NATSBinding, AMQPBinding} {
		if _, ok := b.attribute(name); ok {
			return true
		}
	}
	return false
}

// Structured reports whether contentType is the CloudEvents JSON event
// format (application/cloudevents+json, in any case, with any
// parameters): a message of that type is in structured content mode.
func Structured(contentType string) bool {
	const jsonFormat = "application/cloudevents+json"
	return len(contentType) >= len(jsonFormat) && strings.EqualFold(contentType[:len(jsonFormat)], jsonFormat) &&
		(len(contentType) == len(jsonFormat) || contentType[len(jsonFormat)] == ';' || contentType[len(jsonFormat)] == ' ')
}

// DecodeStructured takes the CloudEvent in m.Body, in the JSON event
// format (structured content mode), into m: its attributes set the fields
// and Headers as [Binding.Decode] does, and data (or data_base64) becomes
// the Body. A JSON string as data is the string's text unless the content
// type is JSON; data without datacontenttype is application/json, as the
// format says. When the body is no CloudEvent of specversion 1.0, m is
// left as it is and the error says why.
func DecodeStructured(m *Message) error {
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(m.Body, &ev); err != nil {
		return fmt.Errorf("structured CloudEvent: %w", err)
	}
	var version string
	if err := json.Unmarshal(ev["specversion"], &version); err != nil || version != SpecVersion {
		return fmt.Errorf("structured CloudEvent: specversion %s, want %q", ev["specversion"], SpecVersion)
	}
	out := *m
	out.Headers = maps.Clone(m.Headers)
	out.ContentType, out.Body = "", nil
	data, hasData := ev["data"]
	for k, raw := range ev {
		if k == "data" || k == "data_base64" {
			continue
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("structured CloudEvent: %s: %w", k, err)
		}
		switch x := v.(type) {
		case string:
			setAttribute(&out, k, x)
		case bool, float64:
			setAttribute(&out, k, string(raw)) // the canonical form of booleans and integers
		}
	}
	switch {
	case ev["data_base64"] != nil:
		var b []byte // encoding/json decodes base64 into []byte
		if err := json.Unmarshal(ev["data_base64"], &b); err != nil {
			return fmt.Errorf("structured CloudEvent: data_base64: %w", err)
		}
		out.Body = b
	case hasData:
		if out.ContentType == "" {
			out.ContentType = "application/json"
		}
		var s string
		if !jsonType(out.ContentType) && json.Unmarshal(data, &s) == nil {
			out.Body = []byte(s)
		} else {
			out.Body = []byte(data)
		}
	}
	*m = out
	return nil
}

// jsonType reports whether a media type is JSON (application/json or a
// +json suffix).
func jsonType(contentType string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(contentType), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

package kinesisbus

// Messages to and from records: a message is a CloudEvent in structured
// content mode (the JSON event format) in the record's data, its Key the
// partition key; a record that is no such event is delivered as it is.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus/driver"
)

// ContentType is the media type of the records omnibus writes.
const ContentType = "application/cloudevents+json"

// HeadersExtension is the CloudEvents extension attribute that carries
// the headers that cannot be attributes themselves ("trace-id"), as a
// JSON object in a string: the JSON event format has no other place for
// them. omnibus takes them out again on receipt.
const HeadersExtension = "omnibusheaders"

// maxPartitionKey is the longest partition key Kinesis takes, in
// characters.
const maxPartitionKey = 256

// partitionKey is the record's partition key for m: its Key, or its ID
// when it has none. A key longer than Kinesis allows is replaced by its
// SHA-256 (in hex), so that it still picks one shard.
func partitionKey(m *driver.Message) string {
	k := m.Key
	if k == "" {
		k = m.ID
	}
	if utf8.RuneCountInString(k) > maxPartitionKey {
		sum := sha256.Sum256([]byte(k))
		return hex.EncodeToString(sum[:])
	}
	return k
}

// encode returns the CloudEvent of m in the JSON event format.
func encode(m *driver.Message) ([]byte, error) {
	ev := make(map[string]any, 8+len(m.Headers))
	ev["specversion"] = driver.SpecVersion
	ev["id"] = m.ID
	for name, v := range map[string]string{"type": m.Type, "source": m.Source, "partitionkey": m.Key, "datacontenttype": m.ContentType} {
		if v != "" {
			ev[name] = v
		}
	}
	if !m.Time.IsZero() {
		ev["time"] = driver.FormatTime(m.Time)
	}
	var other map[string]string
	for k, v := range m.Headers {
		if driver.IsExtension(k) && k != HeadersExtension {
			ev[k] = v
			continue
		}
		if other == nil {
			other = map[string]string{}
		}
		other[k] = v
	}
	if other != nil {
		b, err := json.Marshal(other)
		if err != nil {
			return nil, err
		}
		ev[HeadersExtension] = string(b)
	}
	switch {
	case len(m.Body) == 0 && m.ContentType == "":
	case isJSON(m.ContentType) && json.Valid(m.Body):
		ev["data"] = json.RawMessage(m.Body)
	case m.ContentType != "" && !isJSON(m.ContentType) && utf8.Valid(m.Body):
		ev["data"] = string(m.Body)
	default:
		ev["data_base64"] = m.Body // encoding/json writes []byte in base64
	}
	return json.Marshal(ev)
}

// isJSON reports whether a media type is JSON (application/json, text/json
// or a +json suffix), whose data the event holds as JSON.
func isJSON(contentType string) bool {
	mt, _, _ := strings.Cut(strings.ToLower(contentType), ";")
	mt = strings.TrimSpace(mt)
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// decode turns a record of shard into a message. A record whose data is a
// CloudEvent in the JSON event format takes its fields from the event;
// any other is delivered as it is: Body the data, Key the partition key,
// Time the arrival time, ID "<stream>/<shard>/<sequence number>", which
// is the same every time the record is read.
func decode(stream, shard string, r *types.Record) driver.Message {
	m := driver.Message{
		ID:   fmt.Sprintf("%s/%s/%s", stream, shard, deref(r.SequenceNumber)),
		Key:  deref(r.PartitionKey),
		Body: r.Data,
	}
	if r.ApproximateArrivalTimestamp != nil {
		m.Time = *r.ApproximateArrivalTimestamp
	}
	if len(r.Data) == 0 || r.Data[0] != '{' {
		return m
	}
	ev := m
	ev.ContentType = ContentType
	if err := driver.DecodeStructured(&ev); err != nil {
		return m // not a CloudEvent: delivered as it came
	}
	if raw, ok := ev.Headers[HeadersExtension]; ok {
		var other map[string]string
		if json.Unmarshal([]byte(raw), &other) == nil {
			ev.Headers = maps.Clone(ev.Headers)
			delete(ev.Headers, HeadersExtension)
			for k, v := range other {
				if _, dup := ev.Headers[k]; !dup {
					ev.Headers[k] = v
				}
			}
		}
	}
	return ev
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

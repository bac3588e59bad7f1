package kafkabus

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzRecord: a record with any key, value and headers becomes a
// delivery without panic, and the record a message is published as
// becomes that message again (the CloudEvents Kafka binding both ways).
func FuzzRecord(f *testing.F) {
	fuzztest.SeedMessages(f)
	f.Fuzz(func(t *testing.T, id, key, typ, source, contentType string, nanos int64, hs string, body []byte) {
		r := &kgo.Record{Topic: "t", Key: []byte(key), Value: body}
		for _, h := range fuzztest.Headers(hs) {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h[0], Value: []byte(h[1])})
		}
		_ = delivery(r)

		m := fuzztest.Message(id, key, typ, source, contentType, nanos, hs, body)
		r = record("t", m)
		r.Partition, r.Offset = 3, 42
		fuzztest.Same(t, m, &delivery(r).Message)
	})
}

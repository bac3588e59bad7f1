package rabbitbus

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/internal/fuzztest"
)

// FuzzWire: a delivery with any properties and application properties
// decodes without panic, and a message Publish takes (checkHeaders)
// arrives as it was sent: its publishing, delivered, decodes to it (the
// CloudEvents AMQP binding both ways, keyless messages, and retried ones
// with their attempt and key).
func FuzzWire(f *testing.F) {
	fuzztest.SeedMessages(f)
	f.Fuzz(func(t *testing.T, id, key, typ, source, contentType string, nanos int64, hs string, body []byte) {
		any := amqp.Delivery{MessageId: id, RoutingKey: key, Type: typ, AppId: source, ContentType: contentType,
			Timestamp: time.Unix(0, nanos), Body: body, Redelivered: nanos%2 == 0, Headers: amqp.Table{}}
		for i, h := range fuzztest.Headers(hs) {
			switch i % 4 { // the scalar types foreign publishers send, and a table
			case 0:
				any.Headers[h[0]] = h[1]
			case 1:
				any.Headers[h[0]] = []byte(h[1])
			case 2:
				any.Headers[h[0]] = int32(len(h[1]))
			default:
				any.Headers[h[0]] = amqp.Table{"v": h[1]}
			}
		}
		_, _ = decode(&any, nanos%3 == 0)

		m := fuzztest.Message(id, key, typ, source, contentType, nanos, hs, body)
		if checkHeaders(m) != nil {
			return // Publish refuses it
		}
		for _, retry := range []struct {
			attempt int
			retry   bool
		}{{0, false}, {3, true}} {
			pub := encode(m, true, retry.attempt, retry.retry)
			rk := routingKey(m)
			if retry.retry {
				rk = "retry-queue" // a retry is routed to its delay queue
			}
			d := amqp.Delivery{Headers: pub.Headers, ContentType: pub.ContentType, MessageId: pub.MessageId,
				Type: pub.Type, AppId: pub.AppId, Timestamp: pub.Timestamp, Body: pub.Body, RoutingKey: rk}
			got, attempt := decode(&d, false)
			fuzztest.Same(t, m, &got)
			if want := max(1, retry.attempt); attempt != want {
				t.Errorf("attempt %d, want %d", attempt, want)
			}
		}
	})
}

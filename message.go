package omnibus

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Message is the unit omnibus publishes and delivers.
//
// On every transport with headers a message is a CloudEvent in binary
// content mode, spelled as that transport's CloudEvents protocol binding
// spells it, so other CloudEvents clients read omnibus's messages and
// omnibus reads theirs (membus keeps messages in memory):
//
//	field        CloudEvents      Kafka              RabbitMQ                              NATS JetStream
//	ID           id               ce_id              cloudEvents:id, message-id            ce-id, Nats-Msg-Id
//	Key          partitionkey     record key,        routing key,                          ce-partitionkey
//	                              ce_partitionkey    cloudEvents:partitionkey
//	Type         type             ce_type            cloudEvents:type, type                ce-type
//	Source       source           ce_source          cloudEvents:source, app-id            ce-source
//	Time         time             ce_time            cloudEvents:time, timestamp           ce-time
//	ContentType  datacontenttype  content-type       content-type property                 ce-datacontenttype
//	Body         data             record value       body                                  payload
//	(1.0)        specversion      ce_specversion     cloudEvents:specversion               ce-specversion
//
// Headers and CloudEvents extensions are one thing. A header whose name
// is a CloudEvents attribute name (lowercase ASCII letters and digits,
// such as "tenant") and not one of the attributes above is the extension
// of that name: ce_tenant on Kafka, cloudEvents:tenant on RabbitMQ,
// ce-tenant on NATS. Every extension a message arrives with, whoever wrote
// it, is delivered as the header of its name ("tenant"); so are the
// optional attributes subject and dataschema. Any other header
// ("trace-id", "X-Request-Id", "type") cannot be an extension: it travels
// under its own name as a plain header, which omnibus delivers as it is
// and CloudEvents readers ignore. Header names a binding owns
// (content-type, and names starting with ce_, ce- or cloudEvents:) are
// refused by Publish.
//
// omnibus writes binary content mode and reads structured mode too (the
// JSON event as the body, content type application/cloudevents+json).
// Time travels as RFC 3339 with nanoseconds, so it survives transports
// whose native timestamps are in seconds. A message without Type or
// Source is not a valid CloudEvent; CloudEvents readers may refuse it.
// Each transport's package comment gives the details (what a message
// without ce_* headers from another producer looks like, say).
type Message struct {
	// ID identifies the message. Publish fills it when empty; it stays the
	// same across retries and redeliveries, so receivers can deduplicate.
	ID string
	// Key orders and partitions: messages with the same key land on the
	// same lane and, in key ordering mode, are handled in order.
	Key string
	// Type names what the message is ("order.created").
	Type string
	// Source names who sent it (a URI reference, as in CloudEvents).
	Source string
	// Time is when the message was created. Publish fills it when zero.
	Time time.Time
	// ContentType is the media type of Body ("application/json"), the
	// CloudEvents datacontenttype; empty when not said.
	ContentType string
	// Headers are string pairs carried with the message; those named
	// like CloudEvents attributes ("tenant") are its extensions.
	Headers map[string]string
	// Body is the payload, any bytes.
	Body []byte

	// Set on delivery only.

	// Topic the message was received from.
	Topic string
	// Lane the message was received on (a partition, a shard, a queue).
	Lane string
	// Position in the lane in the transport's own terms.
	Position string
	// Attempt is the delivery attempt, starting at 1.
	Attempt int
}

// idPrefix makes IDs from different processes distinct; the counter makes
// them distinct inside one.
var (
	idPrefix = func() string {
		var b [9]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}()
	idCounter atomic.Uint64
)

// NewID returns a new message ID, unique across processes.
func NewID() string {
	// Built in one buffer: one allocation, where the concatenation made
	// two once the counter passed 99 (~100 ns against ~70).
	var b [40]byte // prefix 18, dash, counter at most 13
	id := append(b[:0], idPrefix...)
	id = append(id, '-')
	return string(strconv.AppendUint(id, idCounter.Add(1), 36))
}

// fill gives m an ID and a time when it has none.
func fill(m *Message, now time.Time) {
	if m.ID == "" {
		m.ID = NewID()
	}
	if m.Time.IsZero() {
		m.Time = now
	}
}

func toDriver(m *Message) driver.Message {
	return driver.Message{ID: m.ID, Key: m.Key, Type: m.Type, Source: m.Source, Time: m.Time, ContentType: m.ContentType, Headers: m.Headers, Body: m.Body}
}

func fromDelivery(m *Message, topic string, d *driver.Delivery) {
	*m = Message{
		ID: d.ID, Key: d.Key, Type: d.Type, Source: d.Source, Time: d.Time, ContentType: d.ContentType, Headers: d.Headers, Body: d.Body,
		Topic: topic, Lane: d.Lane, Position: d.Position,
	}
}

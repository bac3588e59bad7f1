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
// How each field travels (CloudEvents binary content mode where the
// transport has headers, so other CloudEvents clients can read it):
//
//	field    Kafka             RabbitMQ                          NATS JetStream          membus
//	ID       header ce_id      message-id, cloudEvents:id        Nats-Msg-Id, Ce-Id      in memory
//	Key      record key        routing key                       Ce-Partitionkey         in memory
//	Type     header ce_type    type, cloudEvents:type            Ce-Type                 in memory
//	Source   header ce_source  app-id, cloudEvents:source        Ce-Source               in memory
//	Time     header ce_time    timestamp, cloudEvents:time       Ce-Time                 in memory
//	Headers  record headers    application properties            headers                 in memory
//	Body     record value      body                              data                    in memory
//
// Time travels as RFC 3339 with nanoseconds in the CloudEvents time
// header, so it survives transports whose native timestamps are in
// seconds. Each transport's package comment gives the details (what a
// message without ce_* headers from another producer looks like, say).
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
	// Headers are free-form string pairs carried with the message.
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
	return idPrefix + "-" + strconv.FormatUint(idCounter.Add(1), 36)
}

func toDriver(m *Message, now time.Time) driver.Message {
	if m.ID == "" {
		m.ID = NewID()
	}
	if m.Time.IsZero() {
		m.Time = now
	}
	return driver.Message{ID: m.ID, Key: m.Key, Type: m.Type, Source: m.Source, Time: m.Time, ContentType: m.ContentType, Headers: m.Headers, Body: m.Body}
}

func fromDelivery(m *Message, topic string, d *driver.Delivery) {
	*m = Message{
		ID: d.ID, Key: d.Key, Type: d.Type, Source: d.Source, Time: d.Time, ContentType: d.ContentType, Headers: d.Headers, Body: d.Body,
		Topic: topic, Lane: d.Lane, Position: d.Position,
	}
}

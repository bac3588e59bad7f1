package rabbitbus

// The wire format: a message as an AMQP publishing and back (the
// CloudEvents AMQP binding, and the attempt and key of a message Nack
// republished). Pure functions: no goroutine or lock of their own.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// Application properties omnibus writes besides the CloudEvents
// attributes (driver.AMQPBinding) and the user's headers.
const (
	// hdrAttempt is the delivery attempt of a message republished by Nack.
	hdrAttempt = "omnibus-attempt"
	// hdrKey carries the key of a message republished by Nack, whose
	// routing key is then the retry queue's name.
	hdrKey = "omnibus-key"
	// hdrKeyless marks a message published without a key: its routing key
	// is then its ID, so that partitioned topics spread keyless messages.
	hdrKeyless = "omnibus-keyless"
)

// checkHeaders refuses the header names a receiver would not get back:
// the x- prefix is RabbitMQ's (x-death, x-delivery-count; decode leaves
// such headers out), and hdrAttempt, hdrKey and hdrKeyless are
// rabbitbus's own.
func checkHeaders(m *driver.Message) error {
	for k := range m.Headers {
		switch {
		case strings.HasPrefix(k, "x-"):
			return fmt.Errorf("header name %q: the x- prefix is RabbitMQ's", k)
		case k == hdrAttempt || k == hdrKey || k == hdrKeyless:
			return fmt.Errorf("header name %q is rabbitbus's own", k)
		}
	}
	return nil
}

// routingKey is the routing key a message is published with.
func routingKey(m *driver.Message) string {
	if m.Key == "" {
		return m.ID
	}
	return m.Key
}

// encode turns m into an AMQP publishing. attempt > 1 and retryKey mark a
// republished retry.
func encode(m *driver.Message, persistent bool, attempt int, retry bool) amqp.Publishing {
	// Room for the attributes a message usually carries (specversion, id,
	// time, type, source, keyless) plus its own headers: a size hint of
	// at most 8 keeps a small map in one allocation of its slots, where
	// 10 takes four allocations and twice the memory.
	h := make(amqp.Table, len(m.Headers)+8)
	driver.AMQPBinding.Encode(m, func(name, value string) { h[name] = value })
	if m.Key == "" {
		h[hdrKeyless] = true
	} else if retry {
		h[hdrKey] = m.Key
	}
	if attempt > 1 {
		h[hdrAttempt] = int32(attempt)
	}
	mode := amqp.Transient
	if persistent {
		mode = amqp.Persistent
	}
	return amqp.Publishing{
		Headers:      h,
		DeliveryMode: mode,
		ContentType:  m.ContentType,
		MessageId:    m.ID,
		Type:         m.Type,
		AppId:        m.Source,
		Timestamp:    m.Time,
		Body:         m.Body,
	}
}

// decode turns an AMQP delivery into a driver message and the attempt
// number. quorum says whether x-delivery-count counts redeliveries.
func decode(d *amqp.Delivery, quorum bool) (driver.Message, int) {
	// The properties first: the binding's attributes, read below, win.
	m := driver.Message{
		ID:          d.MessageId,
		Key:         d.RoutingKey,
		Type:        d.Type,
		Source:      d.AppId,
		Time:        d.Timestamp,
		ContentType: d.ContentType,
		Body:        d.Body,
	}
	attempt := 1
	redeliveries := -1
	for k, v := range d.Headers {
		switch k {
		case hdrKeyless:
			m.Key = ""
		case hdrKey:
		case hdrAttempt:
			if n, ok := integer(v); ok && n > 0 {
				attempt = n
			}
		case "x-delivery-count":
			if n, ok := integer(v); ok {
				redeliveries = n
			}
		default:
			if strings.HasPrefix(k, "x-") {
				continue
			}
			s, ok := headerString(v)
			if !ok {
				continue
			}
			driver.AMQPBinding.Decode(&m, k, s)
		}
	}
	if driver.Structured(m.ContentType) {
		_ = driver.DecodeStructured(&m) // one that is no CloudEvent stays as it came
	}
	if v, ok := d.Headers[hdrKey]; ok {
		if _, keyless := d.Headers[hdrKeyless]; !keyless {
			m.Key = str(v)
		}
	}
	switch {
	case quorum && redeliveries > 0:
		attempt += redeliveries
	case !quorum && d.Redelivered:
		attempt++ // classic queues only say "at least once before"
	}
	return m, attempt
}

func str(v any) string {
	s, _ := headerString(v)
	return s
}

// headerString renders the scalar AMQP field values as strings; tables
// and arrays (which foreign publishers may send) are skipped.
func headerString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case bool:
		return strconv.FormatBool(x), true
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, float32, float64:
		return fmt.Sprint(x), true
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), true
	}
	return "", false
}

func integer(v any) (int, bool) {
	switch x := v.(type) {
	case int8:
		return int(x), true
	case int16:
		return int(x), true
	case int32:
		return int(x), true
	case int64:
		return int(x), true
	case int:
		return x, true
	case uint8:
		return int(x), true
	case uint16:
		return int(x), true
	case uint32:
		return int(x), true
	case string:
		n, err := strconv.Atoi(x)
		return n, err == nil
	}
	return 0, false
}

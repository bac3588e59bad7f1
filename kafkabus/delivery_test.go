package kafkabus

import (
	"testing"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// BenchmarkDelivery is the cost of turning a record omnibus wrote into a
// delivery: what every consumed message pays in kafkabus.
func BenchmarkDelivery(b *testing.B) {
	m := &driver.Message{ID: "0b6f3c1e-7d7a-4a43-9d7e-2f4f5d2b6a11", Key: "customer-7", Type: "order.created",
		Source: "/shop", Time: time.Now(), ContentType: "application/json", Body: make([]byte, 100)}
	r := record("orders", m)
	r.Partition, r.Offset = 3, 123456
	b.ReportAllocs()
	for b.Loop() {
		_ = delivery(r)
	}
}

// TestDeliveryFields: a delivery's header values, key and position share
// one string; each field gets its own part of it, the position the
// record's offset, with a record key and without one (the key then comes
// from ce_partitionkey).
func TestDeliveryFields(t *testing.T) {
	m := &driver.Message{ID: "id-1", Key: "customer-7", Type: "order.created", Body: []byte("{}")}
	for _, keyed := range []bool{true, false} {
		r := record("orders", m)
		if !keyed {
			r.Key = nil
		}
		r.Partition, r.Offset = 3, 123456
		d := delivery(r)
		if d.Position != "123456" || d.Lane != "3" || d.Key != "customer-7" || d.ID != "id-1" || d.Type != "order.created" {
			t.Errorf("keyed=%v: position %q, lane %q, key %q, ID %q, type %q", keyed, d.Position, d.Lane, d.Key, d.ID, d.Type)
		}
	}
}

package kafkabus

import (
	"strconv"
	"strings"
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
	var a arena // as fit uses one, for a Receive's records
	b.ReportAllocs()
	for b.Loop() {
		_ = a.delivery(r, slabSize)
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
		d := new(arena).delivery(r, 1)
		if d.Position != "123456" || d.Lane != "3" || d.Key != "customer-7" || d.ID != "id-1" || d.Type != "order.created" {
			t.Errorf("keyed=%v: position %q, lane %q, key %q, ID %q, type %q", keyed, d.Position, d.Lane, d.Key, d.ID, d.Type)
		}
	}
}

// TestArenaDeliveries: the deliveries of one arena share its blocks, and
// each keeps its own fields while later ones are made, across new
// slabs and text blocks, whatever a record's size.
func TestArenaDeliveries(t *testing.T) {
	var a arena
	var ds []*driver.Delivery
	var want []*driver.Message
	for i := range 3 * slabSize {
		m := &driver.Message{ID: "id-" + strconv.Itoa(i), Key: "key-" + strconv.Itoa(i%7), Type: "t" + strconv.Itoa(i),
			Body: []byte("{}")}
		if i%50 == 0 {
			m.Type = strings.Repeat("x", 2*textBlock) // larger than a block
		}
		r := record("orders", m)
		r.Partition, r.Offset = int32(i%4), int64(1000+i)
		ds = append(ds, a.delivery(r, 3*slabSize-i))
		want = append(want, m)
	}
	for i, d := range ds {
		m := want[i]
		if d.ID != m.ID || d.Key != m.Key || d.Type != m.Type || d.Position != strconv.Itoa(1000+i) || d.Lane != strconv.Itoa(i%4) {
			t.Fatalf("delivery %d: ID %q, key %q, type of %d bytes, position %q, lane %q; want %q, %q, %d bytes, %d, %d",
				i, d.ID, d.Key, len(d.Type), d.Position, d.Lane, m.ID, m.Key, len(m.Type), 1000+i, i%4)
		}
		if pos := d.Token.(*position); pos.offset != int64(1000+i) || pos.partition != int32(i%4) {
			t.Fatalf("delivery %d: token at partition %d offset %d", i, pos.partition, pos.offset)
		}
	}
}

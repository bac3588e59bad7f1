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

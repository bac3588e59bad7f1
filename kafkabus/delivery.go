package kafkabus

// Deliveries: what a fetched record becomes for the engine, which fit
// (carry.go) hands out.

import (
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus/driver"
)

// received is a consumed record as the engine gets it: a delivery and
// the position its Token points to, in one allocation.
type received struct {
	d driver.Delivery
	p position
}

// position is what a delivery's Token points to: what a commit needs.
type position struct {
	partition int32
	offset    int64
	epoch     int32
}

// delivery turns a fetched record into a delivery. The delivery and its
// position come in one allocation, and the header values, the key and
// the offset share one string: what every consumed record costs.
func delivery(r *kgo.Record) *driver.Delivery {
	x := &received{p: position{partition: r.Partition, offset: r.Offset, epoch: r.LeaderEpoch}}
	d := &x.d
	d.Lane = laneName(r.Partition)
	d.Token = &x.p
	d.Body = r.Value
	var digits [20]byte
	offset := strconv.AppendInt(digits[:0], r.Offset, 10)
	n := len(r.Key) + len(offset)
	for _, h := range r.Headers {
		n += len(h.Value)
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, h := range r.Headers {
		sb.Write(h.Value)
	}
	sb.Write(r.Key)
	sb.Write(offset)
	all, at := sb.String(), 0
	for _, h := range r.Headers {
		driver.KafkaBinding.Decode(&d.Message, h.Key, all[at:at+len(h.Value)])
		at += len(h.Value)
	}
	if driver.Structured(d.ContentType) {
		_ = driver.DecodeStructured(&d.Message) // one that is no CloudEvent stays as it came
	}
	d.Position = all[len(all)-len(offset):]
	if len(r.Key) > 0 {
		d.Key = all[at : at+len(r.Key)] // the record key wins over ce_partitionkey
	}
	if d.ID == "" {
		// A record from a client that sets no ce_id: its place in the log
		// is an ID that stays the same across redeliveries.
		d.ID = r.Topic + "/" + d.Lane + "/" + d.Position
	}
	if d.Time.IsZero() {
		d.Time = r.Timestamp
	}
	return d
}

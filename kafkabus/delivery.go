package kafkabus

// Deliveries: what a fetched record becomes for the engine. fit (carry.go)
// turns a Receive's records into deliveries through one arena, so that
// records share their allocations rather than making two each.

import (
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus/driver"
)

// received is a consumed record as the engine gets it: a delivery and
// the position its Token points to.
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

// Sizes of what an arena allocates at once. A delivery the engine holds
// keeps what it was allocated with; small blocks keep that small next to
// the fetch buffer its body already keeps.
const (
	slabSize  = 64   // deliveries
	textBlock = 4096 // bytes of header values, keys and offsets
)

// arena hands out deliveries and the strings of their fields from
// blocks shared by consecutive records.
type arena struct {
	slab []received
	text strings.Builder
}

// next returns the next delivery's place; more is how many more
// records there may be, bounding the next slab.
func (a *arena) next(more int) *received {
	if len(a.slab) == 0 {
		a.slab = make([]received, max(1, min(slabSize, more)))
	}
	x := &a.slab[0]
	a.slab = a.slab[1:]
	return x
}

// delivery turns a fetched record into a delivery, taken from a. The
// header values, the key and the offset are one string, taken from a's
// current text block: the strings of consecutive records share a block.
func (a *arena) delivery(r *kgo.Record, more int) *driver.Delivery {
	x := a.next(more)
	x.p = position{partition: r.Partition, offset: r.Offset, epoch: r.LeaderEpoch}
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
	sb := &a.text
	if sb.Cap()-sb.Len() < n {
		// A new block: the strings handed out keep the old one.
		*sb = strings.Builder{}
		sb.Grow(max(textBlock, n))
	}
	start := sb.Len()
	for _, h := range r.Headers {
		sb.Write(h.Value)
	}
	sb.Write(r.Key)
	sb.Write(offset)
	// Within the block's capacity the Builder never moves what it
	// wrote: the strings handed out before stay as they were.
	all, at := sb.String()[start:], 0
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

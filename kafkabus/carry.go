package kafkabus

// The carry: records polled and not yet returned by Receive, kept per
// partition in offset order, and handed out with the partitions taking
// turns, so that a member holding several partitions works them all
// rather than one after the other (a fetch holds a partition's records
// together, up to fetch_max_partition_bytes each). It belongs to the
// goroutine calling Receive; fit reads sub.owned and sub.revokedAt under
// sub.mu.

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/omnibus-go/omnibus/driver"
)

// carried is a polled record waiting in carry, with the epoch it was
// polled in.
type carried struct {
	r     *kgo.Record
	epoch uint64
}

// carry holds polled records per partition, in offset order.
type carry struct {
	parts map[int32][]carried
	turn  []int32 // the partitions with records, next to be served first
	n     int
}

func (c *carry) len() int { return c.n }

func (c *carry) add(r carried) {
	if c.parts == nil {
		c.parts = map[int32][]carried{}
	}
	p := r.r.Partition
	if len(c.parts[p]) == 0 {
		c.turn = append(c.turn, p)
	}
	c.parts[p] = append(c.parts[p], r)
	c.n++
}

// fit takes from carry the deliveries that fit in room: an equal share
// of room.Count from each partition in turn (at least one), each
// partition's in offset order; the partitions served go to the back of
// the turn. A record polled while its partition was revoked belongs to
// the old claim and is dropped: the next owner reads it again. The first
// delivery of a claim at the committed offset records the claim (see
// claim).
func (s *sub) fit(ctx context.Context, room driver.Room) []*driver.Delivery {
	c := &s.carry
	if len(c.turn) == 0 {
		return nil
	}
	ds := make([]*driver.Delivery, 0, max(0, min(room.Count, c.n)))
	bytes, full := 0, false
	quota := max(1, (room.Count+len(c.turn)-1)/len(c.turn))
	waiting, served := c.turn[:0:0], []int32(nil)
	s.mu.Lock()
	for _, p := range c.turn {
		q, taken := c.parts[p], 0
		for len(q) > 0 && !full && taken < quota {
			if !s.owned[p] || s.revokedAt[p] > q[0].epoch {
				q = q[1:]
				c.n--
				continue
			}
			d := delivery(q[0].r)
			size := d.Size()
			if full = !room.Fits(len(ds), bytes, size); full {
				break
			}
			bytes += size
			ds = append(ds, d)
			q = q[1:]
			c.n--
			taken++
		}
		switch {
		case len(q) == 0:
			delete(c.parts, p)
		case taken > 0:
			c.parts[p] = q
			served = append(served, p)
		default:
			c.parts[p] = q
			waiting = append(waiting, p)
		}
	}
	s.mu.Unlock()
	c.turn = append(waiting, served...)
	s.claim(ctx, ds)
	return ds
}

package kafkabus

// Age: the timestamp of the record at a group's committed offset, read
// with one Fetch request per partition, sent to the partition's leader,
// and remembered per group and partition until the committed offset
// moves (a stalled lane costs no fetch). It runs on the goroutine reading
// the lag; stampsMu guards the remembered timestamps.

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/omnibus-go/omnibus/driver"
)

// stamps remembers the timestamp of the record at each group's committed
// offset, one entry per group and partition.
type stamps struct {
	mu sync.Mutex
	at map[stampKey]stamp
}

type stampKey struct {
	group, topic string
	partition    int32
}

type stamp struct {
	offset int64
	at     time.Time
}

// ages fills the age of lags[i], the lag of partition parts[i], from the
// record at offset lags[i].Committed: a known 0 where there is no lag,
// the record's timestamp where it could be read, unknown where it could
// not.
func (c *conn) ages(ctx context.Context, topic, group string, parts []int32, lags []driver.LaneLag) {
	now := time.Now()
	var missing []int
	c.stamps.mu.Lock()
	if c.stamps.at == nil {
		c.stamps.at = map[stampKey]stamp{}
	}
	for i, p := range parts {
		l := &lags[i]
		switch s, ok := c.stamps.at[stampKey{group, topic, p}]; {
		case !l.Known:
		case l.Lag == 0:
			l.SetAge(now, now)
		case ok && s.offset == l.Committed:
			l.SetAge(now, s.at)
		default:
			missing = append(missing, i)
		}
	}
	c.stamps.mu.Unlock()
	if len(missing) == 0 {
		return
	}
	meta, err := c.adm.Metadata(ctx, topic)
	if err != nil {
		return
	}
	td, ok := meta.Topics[topic]
	if !ok || td.Err != nil {
		return
	}
	for _, i := range missing {
		p, l := parts[i], &lags[i]
		pd, ok := td.Partitions[p]
		if !ok || pd.Err != nil || pd.Leader < 0 {
			continue
		}
		at, ok := c.recordTime(ctx, topic, td.ID, pd.Leader, p, l.Committed)
		if !ok {
			continue
		}
		l.SetAge(time.Now(), at)
		c.stamps.mu.Lock()
		c.stamps.at[stampKey{group, topic, p}] = stamp{offset: l.Committed, at: at}
		c.stamps.mu.Unlock()
	}
}

// recordTime fetches the record at offset of partition p from its leader
// and returns its timestamp (the producer's, or the broker's on a topic
// with LogAppendTime). A Fetch returns whole record batches: at most one
// here (1 byte asked for; the broker returns the first batch whole), the
// one holding the offset.
func (c *conn) recordTime(ctx context.Context, topic string, id [16]byte, leader, p int32, offset int64) (time.Time, bool) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxBytes = 1
	req.SessionEpoch = -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, offset, 1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, c.admin.Broker(int(leader)))
	if err != nil || len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return time.Time{}, false
	}
	fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Topic: topic, Partition: p, Offset: offset},
		&resp.Topics[0].Partitions[0], kgo.DefaultDecompressor(), nil)
	for _, r := range fp.Records {
		if r.Offset >= offset {
			return r.Timestamp, true
		}
	}
	return time.Time{}, false
}

package kinesisbus

// Lag: per shard, how long the first record after the group's checkpoint
// has waited, read from outside the group (the lease table and one
// GetRecords per shard), so members and `omnibus lag` report the same.
// Called from any goroutine; it holds no lock.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/omnibus-go/omnibus/driver"
)

// Lag implements driver.LagReader: the group's lag on every shard of the
// stream (see GroupLag).
func (s *sub) Lag(ctx context.Context) ([]driver.LaneLag, error) {
	return s.conn.GroupLag(ctx, s.stream, s.group)
}

// GroupLag implements driver.GroupLagReader: for every shard with a lease
// that is not read to its end, the milliseconds the first record after
// the lease's checkpoint has waited since it arrived (at least the
// MillisBehindLatest Kinesis reports for it), 0 when no record follows
// the checkpoint, as Lag (LagMillis) and as Age. A shard whose record
// cannot be read is unknown (Known and AgeKnown false), never zero. A
// group without a lease table is ErrNotFound.
//
// No count of records behind is given: Kinesis has no offsets, and
// sequence numbers grow by unrelated steps, so the only way to count the
// records between a checkpoint and the shard's end is to read them all,
// at the shard's read limit (5 GetRecords a second, 2 MB/s, shared with
// the group's members), which a lag read must not spend.
func (c *conn) GroupLag(ctx context.Context, stream, group string) ([]driver.LaneLag, error) {
	if err := c.checkOpen("lag", stream); err != nil {
		return nil, err
	}
	t := &table{c: c, name: c.cfg.tableName(stream, group)}
	if _, err := c.ddb.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(t.name)}); err != nil {
		if errorCode(err) == codeNotFound {
			return nil, fmt.Errorf("kinesisbus: lag %q: group %q has no lease table %q: %w", stream, group, t.name, driver.ErrNotFound)
		}
		return nil, fmt.Errorf("kinesisbus: lag %q group %q: %w", stream, group, t.fail("describe", err))
	}
	leases, err := t.scan(ctx)
	if err != nil {
		return nil, fmt.Errorf("kinesisbus: lag %q group %q: %w", stream, group, err)
	}
	// Shard IDs have a fixed width: their text orders them.
	slices.SortFunc(leases, func(a, b *lease) int { return strings.Compare(a.key, b.key) })
	lags := make([]driver.LaneLag, 0, len(leases))
	for _, l := range leases {
		if l.ended() {
			continue
		}
		lag, err := c.shardLag(ctx, stream, l)
		ll := driver.LaneLag{Lane: l.key}
		if err == nil {
			// The lag is a time; the same time is the lane's age.
			ll.Lag, ll.Known = lag, true
			ll.Age, ll.AgeKnown = time.Duration(lag)*time.Millisecond, true
		}
		lags = append(lags, ll)
	}
	return lags, nil
}

// shardLag reads the first record after l's checkpoint.
func (c *conn) shardLag(ctx context.Context, stream string, l *lease) (int64, error) {
	s := &sub{conn: c, stream: stream}
	iter, err := s.startIterator(ctx, &shard{id: l.key}, l)
	if err != nil {
		return 0, err
	}
	out, err := c.kin.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(1)})
	if err != nil {
		return 0, err
	}
	return timeLag(c.clock(), out), nil
}

// timeLag is the lag a GetRecords answer from the checkpoint tells at
// now: how long its first record has waited, at least MillisBehindLatest;
// 0 without a record.
func timeLag(now time.Time, out *kinesis.GetRecordsOutput) int64 {
	if len(out.Records) == 0 || out.Records[0].ApproximateArrivalTimestamp == nil {
		return 0
	}
	waited := now.Sub(*out.Records[0].ApproximateArrivalTimestamp).Milliseconds()
	behind := int64(0)
	if out.MillisBehindLatest != nil {
		behind = *out.MillisBehindLatest
	}
	return max(waited, behind, 0)
}

package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/kinesisbus"
)

func init() {
	baselines[kinesisbus.Scheme] = baseline{client: "aws-sdk-go-v2", run: kinesisBaseline}
}

// kinesisBaseline does bench's work with the AWS SDK's Kinesis client as
// its users write it: a stream of --lanes shards, PutRecords of --batch
// records (the body as the record's data, which has no headers; records
// Kinesis refuses are sent again), while one goroutine per shard loops
// GetRecords from TRIM_HORIZON, waiting the URL's poll_interval when caught
// up, as kinesisbus's readers (and the KCL's) do: Kinesis allows 5 reads a
// second per shard. It deletes its stream when done.
func kinesisBaseline(ctx context.Context, c *omnibus.Client, rawURL, stream string, o benchOptions, left *leftovers) (pubRate, conRate float64, err error) {
	kin, err := kinesisbus.NewKinesisClient(ctx, rawURL)
	if err != nil {
		return 0, 0, err
	}
	poll := kinesisbus.DefaultPollInterval
	if u, err := url.Parse(rawURL); err == nil && u.Query().Get("poll_interval") != "" {
		if poll, err = time.ParseDuration(u.Query().Get("poll_interval")); err != nil {
			return 0, 0, fmt.Errorf("poll_interval: %w", err)
		}
	}
	if _, err := kin.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(stream), ShardCount: aws.Int32(int32(o.lanes))}); err != nil {
		return 0, 0, fmt.Errorf("create stream: %w", err)
	}
	// kinesisbus deletes it, waiting until Kinesis no longer knows it.
	defer left.remove(ctx, "stream "+stream, func(ctx context.Context) error { return c.Driver().(topicDeleter).DeleteTopic(ctx, stream) })
	if err := kinesis.NewStreamExistsWaiter(kin).Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(stream)}, time.Minute,
		func(o *kinesis.StreamExistsWaiterOptions) { o.MinDelay, o.MaxDelay = 50*time.Millisecond, time.Second }); err != nil {
		return 0, 0, fmt.Errorf("create stream: %w", err)
	}
	shards, err := kin.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		return 0, 0, fmt.Errorf("list shards: %w", err)
	}

	var received, last atomic.Int64
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var readErr atomic.Value
	done := make(chan struct{})
	for _, s := range shards.Shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it, err := kin.GetShardIterator(rctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: s.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
			if err != nil {
				readErr.CompareAndSwap(nil, err)
				return
			}
			for iter := it.ShardIterator; rctx.Err() == nil && iter != nil; {
				out, err := kin.GetRecords(rctx, &kinesis.GetRecordsInput{ShardIterator: iter})
				if err != nil {
					if rctx.Err() == nil {
						readErr.CompareAndSwap(nil, err)
					}
					return
				}
				if len(out.Records) > 0 {
					last.Store(time.Now().UnixNano())
					if received.Add(int64(len(out.Records))) == int64(o.count) {
						close(done)
					}
				}
				iter = out.NextShardIterator
				if len(out.Records) == 0 || aws.ToInt64(out.MillisBehindLatest) == 0 && len(out.Records) < 10000 {
					select {
					case <-rctx.Done():
					case <-time.After(poll):
					}
				}
			}
		}()
	}
	defer wg.Wait()
	defer stop()

	body := generatedBody(0, o.size)
	t0 := time.Now()
	for i := 0; i < o.count; i += o.batch {
		rs := make([]types.PutRecordsRequestEntry, min(o.batch, o.count-i))
		for j := range rs {
			rs[j] = types.PutRecordsRequestEntry{Data: body, PartitionKey: aws.String("k" + strconv.Itoa((i+j)%64))}
		}
		for len(rs) > 0 {
			out, err := kin.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String(stream), Records: rs})
			if err != nil {
				return 0, 0, fmt.Errorf("publish: %w", err)
			}
			var again []types.PutRecordsRequestEntry
			for j, r := range out.Records {
				if r.ErrorCode != nil {
					again = append(again, rs[j])
				}
			}
			rs = again
		}
	}
	pubDur := time.Since(t0)
	timer := time.NewTimer(o.timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-timer.C:
		if err, _ := readErr.Load().(error); err != nil {
			return 0, 0, fmt.Errorf("consume: %w", err)
		}
		return 0, 0, fmt.Errorf("consumed %d of %d messages in %v", received.Load(), o.count, o.timeout)
	}
	return rate(o.count, pubDur), rate(o.count, time.Unix(0, last.Load()).Sub(t0)), nil
}

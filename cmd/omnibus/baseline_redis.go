package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/omnibus-go/omnibus"
	"github.com/omnibus-go/omnibus/driver"
	"github.com/omnibus-go/omnibus/redisbus"
)

func init() {
	baselines[redisbus.Scheme] = baseline{client: "go-redis", run: redisBaseline}
}

// redisBaseline does bench's work with go-redis as redisbus does it: the
// same fields (the CloudEvents attributes, the send time, the body in
// data), XADD pipelined in batches of --batch, while a consumer of a new
// group reads with XREADGROUP (the window of the default MaxInFlight) and
// acknowledges each read with one XACK. On a partitioned URL it publishes
// to --lanes streams by key and reads them all, as redisbus's partitioned
// mode does (without the leases). It deletes its streams, with the
// group, when done.
func redisBaseline(ctx context.Context, _ *omnibus.Client, rawURL, topic string, o benchOptions, left *leftovers) (pubRate, conRate float64, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, 0, err
	}
	opt, err := redisbus.ClientOptions(rawURL)
	if err != nil {
		return 0, 0, err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	streams := []string{topic}
	if u.Query().Get("partitions") != "" {
		streams = streams[:0]
		for p := range o.lanes {
			streams = append(streams, topic+":"+strconv.Itoa(p))
		}
	}
	defer left.remove(ctx, "streams "+strings.Join(streams, ", "), func(ctx context.Context) error { return rdb.Del(ctx, streams...).Err() })
	for _, s := range streams {
		if err := rdb.XGroupCreateMkStream(ctx, s, "raw", "0").Err(); err != nil {
			return 0, 0, fmt.Errorf("create group: %w", err)
		}
	}

	const window = 256 // omnibus.MaxInFlight's default
	var received, last atomic.Int64
	var lat latencies
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		args := append(append([]string{}, streams...), make([]string, len(streams))...)
		for i := range streams {
			args[len(streams)+i] = ">"
		}
		for received.Load() < int64(o.count) {
			res, err := rdb.XReadGroup(rctx, &redis.XReadGroupArgs{Group: "raw", Consumer: "raw", Streams: args, Count: window, Block: time.Second}).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				done <- err
				return
			}
			now := time.Now()
			for _, st := range res {
				ids := make([]string, len(st.Messages))
				for i, m := range st.Messages {
					sent, _ := m.Values[headerSent].(string)
					lat.add(now, sent)
					ids[i] = m.ID
				}
				if err := rdb.XAck(rctx, st.Stream, "raw", ids...).Err(); err != nil {
					done <- err
					return
				}
				received.Add(int64(len(ids)))
			}
			last.Store(now.UnixNano())
		}
		done <- nil
	}()

	body := generatedBody(0, o.size)
	t0 := time.Now()
	for i := 0; i < o.count; i += o.batch {
		sent := strconv.FormatInt(time.Now().UnixNano(), 10)
		pipe := rdb.Pipeline()
		for j := i; j < min(o.count, i+o.batch); j++ {
			key := "k" + strconv.Itoa(j%64)
			s := streams[0]
			if len(streams) > 1 {
				s = streams[driver.Partition(key, len(streams))]
			}
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: s, Values: []any{
				"ce_specversion", "1.0", "ce_id", omnibus.NewID(), "ce_time", time.Now().UTC().Format(time.RFC3339Nano),
				"ce_partitionkey", key, headerSent, sent, "data", body}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, 0, fmt.Errorf("publish: %w", err)
		}
	}
	pubDur := time.Since(t0)
	timer := time.NewTimer(o.timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return 0, 0, fmt.Errorf("consume: %w", err)
		}
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-timer.C:
		return 0, 0, fmt.Errorf("consumed %d of %d messages in %v", received.Load(), o.count, o.timeout)
	}
	return rate(o.count, pubDur), rate(o.count, time.Unix(0, last.Load()).Sub(t0)), nil
}

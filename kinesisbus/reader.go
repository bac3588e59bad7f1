package kinesisbus

// Readers: one goroutine per shard held, polling GetRecords from the
// lease's checkpoint into the shard's buffer (sub.mu), at most
// maxBuffered records and sub.bufBytes bytes ahead of Receive, asking for
// as many records per call as fit in that by the size of those it read
// last (GetRecords has no byte limit of its own below 10 MiB). An empty
// answer waits poll_interval; a throttled one backs off; an expired
// iterator is asked for again after the last record read; a call that
// does not answer within callTimeout is made again, for half as many
// records (twice as many again after each answer that came within a
// quarter of it). A closed shard's reader stops at its end, and the
// shard is finished once its last record is checkpointed.

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus/driver"
)

// Backoff of a reader after a throttled or failed GetRecords.
const (
	readBackoffFirst = 200 * time.Millisecond
	readBackoffMost  = 10 * time.Second
	// iteratorTimeout bounds a GetShardIterator call.
	iteratorTimeout = 2 * time.Second
)

func (s *sub) startReader(sh *shard) {
	ctx, cancel := context.WithCancel(s.ctx)
	s.mu.Lock()
	if sh.gone || sh.revoking {
		s.mu.Unlock()
		cancel()
		return
	}
	sh.stop, sh.done = cancel, make(chan struct{})
	s.mu.Unlock()
	s.readers.Add(1)
	go func() {
		defer s.readers.Done()
		defer close(sh.done)
		defer cancel()
		s.read(ctx, sh)
	}()
}

// stopReader stops sh's reader and waits for it.
func (s *sub) stopReader(sh *shard) {
	s.mu.Lock()
	stop, done := sh.stop, sh.done
	s.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// startIterator asks for an iterator at where the lease says to start.
func (s *sub) startIterator(ctx context.Context, sh *shard, l *lease) (*string, error) {
	in := &kinesis.GetShardIteratorInput{StreamName: aws.String(s.stream), ShardId: aws.String(sh.id)}
	switch l.checkpoint {
	case TrimHorizon, "":
		in.ShardIteratorType = types.ShardIteratorTypeTrimHorizon
	case Latest:
		in.ShardIteratorType = types.ShardIteratorTypeLatest
	case AtTimestamp:
		in.ShardIteratorType = types.ShardIteratorTypeAtTimestamp
		in.Timestamp = aws.Time(time.UnixMilli(l.startTime))
	default:
		in.StartingSequenceNumber = aws.String(l.checkpoint)
		in.ShardIteratorType = types.ShardIteratorTypeAfterSequenceNumber
		if l.subSequence > 0 {
			// Part of an aggregated record was processed: it is read
			// again whole.
			in.ShardIteratorType = types.ShardIteratorTypeAtSequenceNumber
		}
	}
	out, err := s.conn.kin.GetShardIterator(ctx, in)
	if err != nil {
		return nil, err
	}
	return out.ShardIterator, nil
}

// read polls sh until ctx ends or the shard ends.
func (s *sub) read(ctx context.Context, sh *shard) {
	from := *sh.from
	var iter *string
	failures := 0
	// most is the most records asked for: max_records, halved by each
	// call that did not answer in time, doubled again by each quick
	// answer (a link too slow for big answers does not answer a call for
	// half as many quickly, so it does not time out every other call).
	most := s.conn.cfg.maxRecords
	limit := most
	backoff := func(err error) bool {
		failures++
		if ctx.Err() != nil {
			return false
		}
		level := s.logger.Debug
		if !throttled(err) && failures > 3 {
			level = s.logger.Warn
		}
		level("reading a shard failed; backing off", "shard", sh.id, "attempt", failures, "err", s.conn.classify(err))
		return sleep(ctx, driver.Backoff(failures, readBackoffFirst, readBackoffMost))
	}
	for ctx.Err() == nil {
		if !s.awaitSpace(ctx, sh) {
			return
		}
		if iter == nil {
			ictx, cancel := context.WithTimeout(ctx, iteratorTimeout)
			it, err := s.startIterator(ictx, sh, &from)
			cancel()
			if err != nil && ctx.Err() == nil && ictx.Err() != nil {
				// kinesalite answers an AT_TIMESTAMP request only once a
				// record is there: ask again.
				continue
			}
			if err != nil {
				if !backoff(err) {
					return
				}
				continue
			}
			iter = it
		}
		asked := limit
		began := time.Now()
		gctx, cancel := context.WithTimeout(ctx, s.conn.callTimeout())
		out, err := s.conn.kin.GetRecords(gctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(asked)})
		timedOut := ctx.Err() == nil && gctx.Err() != nil
		cancel()
		if err != nil {
			if errorCode(err) == codeExpired {
				iter = nil // from the last record read
				continue
			}
			if timedOut {
				// A connection that stopped answering, or an answer too
				// big to come in time: ask again (the iterator is still
				// good), for fewer records.
				most = max(asked/2, 1)
				limit = most
			}
			if !backoff(err) {
				return
			}
			continue
		}
		failures = 0
		if most < s.conn.cfg.maxRecords && time.Since(began) < s.conn.callTimeout()/4 {
			most = min(most*2, s.conn.cfg.maxRecords)
		}
		if n := len(out.Records); n > 0 {
			size := 0
			for _, r := range out.Records {
				size += len(r.Data) + len(deref(r.PartitionKey))
			}
			limit = int32(min(max(s.bufBytes/max(size/n, 1), 1), int(most)))
			from = lease{checkpoint: deref(out.Records[n-1].SequenceNumber)}
			s.buffer(sh, out.Records)
		}
		if out.NextShardIterator == nil {
			s.mu.Lock()
			sh.ended = true
			s.mu.Unlock()
			if err := s.maybeFinish(ctx, sh); err != nil && ctx.Err() == nil {
				s.logger.Warn("checkpointing the end of a shard failed", "shard", sh.id, "err", err)
			}
			return
		}
		iter = out.NextShardIterator
		behind := out.MillisBehindLatest != nil && *out.MillisBehindLatest > 0
		if len(out.Records) == 0 || !behind && len(out.Records) < int(asked) {
			if !sleep(ctx, s.conn.cfg.pollInterval) {
				return
			}
		}
	}
}

// buffer appends records to sh's buffer and wakes Receive.
func (s *sub) buffer(sh *shard, records []types.Record) {
	ds := make([]*driver.Delivery, len(records))
	for i := range records {
		r := &records[i]
		seq := deref(r.SequenceNumber)
		ds[i] = &driver.Delivery{
			Message:  decode(s.stream, sh.id, r),
			Lane:     sh.id,
			Position: seq,
			Token:    &token{shard: sh, seq: seq},
		}
	}
	s.mu.Lock()
	if !sh.gone && !sh.revoking {
		sh.buf = append(sh.buf, ds...)
		for _, d := range ds {
			sh.bufBytes += d.Size()
		}
	}
	s.mu.Unlock()
	driver.Notify(s.wake)
}

// awaitSpace waits until sh's buffer has room; false when ctx ended.
func (s *sub) awaitSpace(ctx context.Context, sh *shard) bool {
	for {
		s.mu.Lock()
		full := len(sh.buf) >= maxBuffered || sh.bufBytes >= s.bufBytes
		s.mu.Unlock()
		if !full {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-sh.space:
		}
	}
}

// sleep waits d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

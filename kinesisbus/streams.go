package kinesisbus

// Streams: CreateTopic, making sure a stream exists before the first
// publish or subscribe (creating dead-letter streams), listing a
// stream's shards, whether a stream exists, and deleting a stream and a
// group's lease table. The
// cache of streams seen is conn.mu's.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus/driver"
)

// CreateTopic implements driver.TopicCreator: it creates stream with n
// shards when it does not exist, and waits until it is ACTIVE. A stream
// that exists is left as it is, whatever its shard count.
func (c *conn) CreateTopic(ctx context.Context, stream string, n int) error {
	if err := c.checkOpen("create topic", stream); err != nil {
		return err
	}
	if n < 1 {
		return fmt.Errorf("kinesisbus: create stream %q: %d shards: %w", stream, n, driver.ErrInvalid)
	}
	if err := c.createStream(ctx, stream, int32(n)); err != nil {
		return fmt.Errorf("kinesisbus: create stream %q: %w", stream, err)
	}
	return nil
}

// createStream creates stream, treating "already exists" as success, and
// waits until it is ACTIVE.
func (c *conn) createStream(ctx context.Context, stream string, n int32) error {
	_, err := c.kin.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(stream), ShardCount: aws.Int32(n)})
	if err != nil && errorCode(err) != codeInUse {
		return c.classify(err)
	}
	return c.awaitActive(ctx, stream)
}

// awaitActive waits until stream is ACTIVE (or UPDATING: resharding,
// during which it takes records).
func (c *conn) awaitActive(ctx context.Context, stream string) error {
	for attempt := 1; ; attempt++ {
		out, err := c.kin.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)})
		if err != nil && !throttled(err) {
			return c.classify(err)
		}
		if err == nil {
			switch out.StreamDescriptionSummary.StreamStatus {
			case types.StreamStatusActive, types.StreamStatusUpdating:
				c.mu.Lock()
				c.known[stream] = true
				c.mu.Unlock()
				return nil
			case types.StreamStatusDeleting:
				return fmt.Errorf("stream is being deleted: %w", driver.ErrNotFound)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the stream to become ACTIVE: %w", ctx.Err())
		case <-time.After(driver.Backoff(attempt, 20*time.Millisecond, time.Second)):
		}
	}
}

// autoCreate reports whether stream is created on first use.
func (c *conn) autoCreate(stream string, deadLetter bool) bool {
	switch c.cfg.createStreams {
	case CreateAll:
		return true
	case CreateDLQ:
		return deadLetter || strings.HasSuffix(stream, DefaultDLQSuffix)
	}
	return false
}

// ensureStream makes sure stream exists before the first publish or
// subscribe, creating it when create_streams says so; it remembers
// streams seen, so only the first use costs a request.
func (c *conn) ensureStream(ctx context.Context, op, stream string, deadLetter bool) error {
	if stream == "" {
		return fmt.Errorf("kinesisbus: %s: empty stream name: %w", op, driver.ErrInvalid)
	}
	c.mu.Lock()
	known := c.known[stream]
	c.mu.Unlock()
	if known {
		return nil
	}
	err := c.awaitActive(ctx, stream)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, driver.ErrNotFound) && c.autoCreate(stream, deadLetter):
		if err := c.createStream(ctx, stream, c.cfg.shards); err != nil {
			return fmt.Errorf("kinesisbus: %s %q: create stream: %w", op, stream, err)
		}
		return nil
	case errors.Is(err, driver.ErrNotFound):
		return fmt.Errorf("kinesisbus: %s %q: stream does not exist: %w (create it first, or open with create_streams=all)", op, stream, err)
	}
	return fmt.Errorf("kinesisbus: %s %q: %w", op, stream, err)
}

// forget drops stream from the cache (it was found missing).
func (c *conn) forget(stream string) {
	c.mu.Lock()
	delete(c.known, stream)
	c.mu.Unlock()
}

// shardInfo is what kinesisbus needs of a shard.
type shardInfo struct {
	id      string
	parents []string // parent and adjacent parent, where they are
	closed  bool     // has an ending sequence number: split, merged
	start   string   // hash key range, as the KCL records it in the lease
	end     string
}

// listShards returns every shard of stream Kinesis still lists, in the
// order it lists them (parents before their children).
func (c *conn) listShards(ctx context.Context, stream string) ([]shardInfo, error) {
	var shards []shardInfo
	in := &kinesis.ListShardsInput{StreamName: aws.String(stream)}
	for {
		pctx, cancel := context.WithTimeout(ctx, c.callTimeout())
		out, err := c.kin.ListShards(pctx, in)
		cancel()
		if err != nil {
			return nil, c.classify(err)
		}
		for _, s := range out.Shards {
			si := shardInfo{id: deref(s.ShardId), closed: s.SequenceNumberRange != nil && s.SequenceNumberRange.EndingSequenceNumber != nil}
			for _, p := range []*string{s.ParentShardId, s.AdjacentParentShardId} {
				if p != nil && *p != "" {
					si.parents = append(si.parents, *p)
				}
			}
			if s.HashKeyRange != nil {
				si.start, si.end = deref(s.HashKeyRange.StartingHashKey), deref(s.HashKeyRange.EndingHashKey)
			}
			shards = append(shards, si)
		}
		if out.NextToken == nil || *out.NextToken == "" {
			return shards, nil
		}
		in = &kinesis.ListShardsInput{NextToken: out.NextToken}
	}
}

// TopicExists reports whether Kinesis knows stream, in any state
// (CREATING, ACTIVE, UPDATING or DELETING).
func (c *conn) TopicExists(ctx context.Context, stream string) (bool, error) {
	if err := c.checkOpen("stream exists", stream); err != nil {
		return false, err
	}
	_, err := c.kin.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)})
	switch {
	case errorCode(err) == codeNotFound:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("kinesisbus: stream exists %q: %w", stream, c.classify(err))
	}
	return true, nil
}

// DeleteTopic deletes stream, with its records and any consumers
// registered on it, and waits until Kinesis no longer knows it; a stream
// that does not exist is no error. The groups' lease tables are in
// DynamoDB, apart from the stream: DeleteGroup removes them. The CLI's
// bench removes the stream it made with it.
func (c *conn) DeleteTopic(ctx context.Context, stream string) error {
	if err := c.checkOpen("delete stream", stream); err != nil {
		return err
	}
	c.forget(stream)
	err := deleteUntilGone(ctx, func(ctx context.Context) error {
		_, err := c.kin.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(stream), EnforceConsumerDeletion: aws.Bool(true)})
		return err
	})
	if err != nil {
		return fmt.Errorf("kinesisbus: delete stream %q: %w", stream, c.classify(err))
	}
	return nil
}

// DeleteGroup deletes group's lease table of stream (lease_table names
// it), with its leases and checkpoints, and waits until DynamoDB no
// longer knows it; a table that does not exist is no error. A member
// still running creates the table again: its lanes are lost, and it
// reads on, failover_time to about twice that later, from where a new
// group starts (the package doc says what that redelivers or skips); to remove
// a group for good, delete it once its members stopped. The CLI's bench
// removes its group with it.
func (c *conn) DeleteGroup(ctx context.Context, stream, group string) error {
	if err := c.checkOpen("delete group", stream); err != nil {
		return err
	}
	name := c.cfg.tableName(stream, group)
	err := deleteUntilGone(ctx, func(ctx context.Context) error {
		_, err := c.ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
		return err
	})
	if err != nil {
		return fmt.Errorf("kinesisbus: delete group %q of stream %q: lease table %q: %w", group, stream, name, c.classify(err))
	}
	return nil
}

// deleteUntilGone calls del until the answer is that the resource does
// not exist: one being deleted (or created) is in use, and is asked for
// again after a while.
func deleteUntilGone(ctx context.Context, del func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := del(ctx)
		switch {
		case errorCode(err) == codeNotFound:
			return nil
		case err != nil && errorCode(err) != codeInUse && !throttled(err):
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the deletion: %w", ctx.Err())
		case <-time.After(driver.Backoff(attempt, 20*time.Millisecond, time.Second)):
		}
	}
}

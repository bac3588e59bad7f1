package kinesisbus

// Publishing: messages become records in PutRecords calls of at most 500
// records and 5 MiB; records Kinesis refuses for throughput or an
// internal failure are sent again, one by one as they failed, until they
// land or ctx ends. Runs on the caller's goroutine.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/omnibus-go/omnibus/driver"
)

// PutRecords' limits.
const (
	maxBatchRecords = 500
	maxBatchBytes   = 5 << 20
)

// Backoff between attempts at records Kinesis refused.
const (
	retryFirst = 50 * time.Millisecond
	retryMost  = 2 * time.Second
)

// Publish implements driver.Conn. A message whose record would be over
// 1 MiB fails alone with ErrTooLarge; the others are sent. Records that
// still fail when ctx ends fail alone with the last error Kinesis gave
// them. Kinesis has no producer acknowledgement levels: every durability
// waits for PutRecords' answer (the records are then stored in three
// availability zones).
func (c *conn) Publish(ctx context.Context, stream string, msgs []*driver.Message, opts driver.PublishOptions) error {
	if err := c.checkOpen("publish", stream); err != nil {
		return err
	}
	if err := c.ensureStream(ctx, "publish", stream, opts.DeadLetter); err != nil {
		return err
	}
	errs := make([]error, len(msgs))
	entries := make([]types.PutRecordsRequestEntry, 0, len(msgs))
	index := make([]int, 0, len(msgs)) // entries[i] is msgs[index[i]]
	for i, m := range msgs {
		data, err := encode(m)
		if err != nil {
			errs[i] = fmt.Errorf("kinesisbus: publish %q: encode message %q: %w: %w", stream, m.ID, err, driver.ErrInvalid)
			continue
		}
		key := partitionKey(m)
		if size := len(data) + len(key); size > MaxRecordBytes {
			errs[i] = fmt.Errorf("kinesisbus: publish %q: message %q is a record of %d bytes, over Kinesis's %d: %w",
				stream, m.ID, size, MaxRecordBytes, driver.ErrTooLarge)
			continue
		}
		entries = append(entries, types.PutRecordsRequestEntry{Data: data, PartitionKey: aws.String(key)})
		index = append(index, i)
	}
	for len(entries) > 0 {
		n, bytes := 0, 0
		for n < len(entries) && n < maxBatchRecords {
			size := len(entries[n].Data) + len(*entries[n].PartitionKey)
			if n > 0 && bytes+size > maxBatchBytes {
				break
			}
			bytes += size
			n++
		}
		if err := c.put(ctx, stream, entries[:n], index[:n], errs); err != nil {
			return err
		}
		entries, index = entries[n:], index[n:]
	}
	for _, err := range errs {
		if err != nil {
			return &driver.MessageErrors{Errs: errs}
		}
	}
	return nil
}

// put sends one batch, sending again what Kinesis refused until it lands
// or ctx ends; per-record failures go to errs (by message index). An
// error that fails the whole batch for good (the stream is gone, no
// permission) is returned.
func (c *conn) put(ctx context.Context, stream string, entries []types.PutRecordsRequestEntry, index []int, errs []error) error {
	var last error
	for attempt := 1; ; attempt++ {
		out, err := c.kin.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String(stream), Records: entries})
		switch {
		case err == nil:
			var retryEntries []types.PutRecordsRequestEntry
			var retryIndex []int
			for i, r := range out.Records {
				if r.ErrorCode == nil {
					continue
				}
				last = fmt.Errorf("kinesisbus: publish %q: %s: %s", stream, *r.ErrorCode, deref(r.ErrorMessage))
				if !retryableCode(*r.ErrorCode) {
					errs[index[i]] = last
					continue
				}
				retryEntries = append(retryEntries, entries[i])
				retryIndex = append(retryIndex, index[i])
			}
			if len(retryEntries) == 0 {
				return nil
			}
			entries, index = retryEntries, retryIndex
		case errorCode(err) == codeNotFound:
			c.forget(stream)
			return fmt.Errorf("kinesisbus: publish %q: %w", stream, c.classify(err))
		case errors.Is(c.classify(err), driver.ErrRetryable):
			last = fmt.Errorf("kinesisbus: publish %q: %w", stream, c.classify(err))
		case ctx.Err() == nil && isTransport(err):
			// The request may have reached Kinesis, which keeps no IDs:
			// sent again, its records may be in the stream twice.
			last = fmt.Errorf("kinesisbus: publish %q: %w", stream, c.classify(err))
			c.logger.Warn("publishing records again after an error that may have come after Kinesis stored them; they may be in the stream twice",
				"stream", stream, "records", len(entries), "err", last)
		default:
			return fmt.Errorf("kinesisbus: publish %q: %w", stream, c.classify(err))
		}
		select {
		case <-ctx.Done():
			for _, i := range index {
				errs[i] = fmt.Errorf("%w (gave up when the publish's context ended: %w)", last, ctx.Err())
			}
			return nil
		case <-time.After(driver.Backoff(attempt, retryFirst, retryMost)):
		}
	}
}

// retryableCode reports whether a record that failed with code may be
// sent again: Kinesis refused it for throughput, or failed inside.
func retryableCode(code string) bool {
	return code == codeThroughput || code == codeInternal || code == "InternalFailure" || code == "KMSThrottlingException"
}

// isTransport reports whether err is no answer from Kinesis (a reset
// connection, a timeout): the records may or may not have landed, and
// sending them again may duplicate them, which at-least-once allows.
func isTransport(err error) bool {
	return errorCode(err) == ""
}

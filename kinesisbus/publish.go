package kinesisbus

// Publishing: messages become records in PutRecords calls of at most 500
// records and 5 MiB; records Kinesis refuses for throughput or an
// internal failure are sent again, one by one as they failed, until they
// land or ctx ends. A call whose outcome is unknown (no answer, or a
// failure on Kinesis's side that may have come after it stored the
// records) is not sent again here: Kinesis keeps no IDs, so a second
// copy would be stored silently. Its messages fail marked
// ErrOutcomeUnknown, and omnibus's Publish sends them again where its
// hooks and log see it. Runs on the caller's goroutine.

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
		failed, err := c.put(ctx, stream, entries[:n], index[:n], errs)
		if err != nil {
			if len(failed) == len(msgs) {
				// The first call failed, with every message in it and
				// none refused alone: the error applies to them all.
				return err
			}
			for _, i := range failed {
				errs[i] = err
			}
			// The later batches are not sent: after an unknown outcome,
			// they would land before the batch is sent again, ahead of
			// earlier records of their keys. Never sent, they can be
			// sent again as they are; after a refusal for good (the
			// stream is gone), the same refusal applies to them.
			notSent := err
			if errors.Is(err, driver.ErrOutcomeUnknown) {
				notSent = fmt.Errorf("kinesisbus: publish %q: not sent, as the outcome of an earlier batch of the publish is unknown: %w", stream, driver.ErrRetryable)
			}
			for _, i := range index[n:] {
				errs[i] = notSent
			}
			break
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

// put sends one batch, sending again what Kinesis refused (records it
// failed for throughput or inside, a call throttled or that found no
// connection: none of them stored) until it lands or ctx ends;
// per-record failures go to errs (by message index). It returns an error
// that fails the messages of failed (those of the batch that had not
// landed) when a call's outcome is unknown (marked ErrOutcomeUnknown:
// the records may be stored) or Kinesis refused it for good (the stream
// is gone, no permission).
func (c *conn) put(ctx context.Context, stream string, entries []types.PutRecordsRequestEntry, index []int, errs []error) ([]int, error) {
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
				return nil, nil
			}
			entries, index = retryEntries, retryIndex
		case errorCode(err) == codeNotFound:
			c.forget(stream)
			return index, fmt.Errorf("kinesisbus: publish %q: %w", stream, c.classify(err))
		case errors.Is(c.classify(err), driver.ErrRetryable):
			// Throttled, or no connection: Kinesis did not act.
			last = fmt.Errorf("kinesisbus: publish %q: %w", stream, c.classify(err))
		case outcomeUnknown(err):
			// Kinesis keeps no IDs: sent again here, records it stored
			// would be in the stream twice, unseen. omnibus's Publish
			// sends them again, logged and seen by its hooks.
			return index, fmt.Errorf("kinesisbus: publish %q: %d records may or may not be stored: %w", stream, len(entries), c.unknown(err))
		default:
			return index, fmt.Errorf("kinesisbus: publish %q: %w", stream, c.classify(err))
		}
		select {
		case <-ctx.Done():
			for _, i := range index {
				errs[i] = fmt.Errorf("%w (gave up when the publish's context ended: %w)", last, ctx.Err())
			}
			return nil, nil
		case <-time.After(driver.Backoff(attempt, retryFirst, retryMost)):
		}
	}
}

// retryableCode reports whether a record that failed with code may be
// sent again: Kinesis refused it for throughput, or failed inside. A
// record PutRecords answers with an error code was not added to the
// stream.
func retryableCode(code string) bool {
	return code == codeThroughput || code == codeInternal || code == "KMSThrottlingException"
}

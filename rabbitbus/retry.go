package rabbitbus

// Retries through the broker: Nack republishes to a retry queue per
// delay bucket (a queue with that message TTL, which dead-letters back
// into the group's queue) and acknowledges what was confirmed. It runs
// on the engine's workers; the state it touches is the publisher's and
// the declaration cache (conn.mu).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/omnibus-go/omnibus/driver"
)

// Retry-queue delays are rounded to the nearest power of √2 milliseconds,
// so a group has a few dozen retry queues at most.
const (
	minRetryDelay = 10 * time.Millisecond
	maxRetryDelay = 24 * time.Hour
)

func retryBucket(d time.Duration) time.Duration {
	return bucketDelay(bucketIndex(min(max(d, minRetryDelay), maxRetryDelay)))
}

// bucketIndex is the power of √2 nearest d in milliseconds; bucketDelay
// is that power as a delay.
func bucketIndex(d time.Duration) float64 {
	return math.Round(2 * math.Log2(float64(d)/float64(time.Millisecond)))
}

func bucketDelay(k float64) time.Duration {
	return time.Duration(math.Round(math.Pow(2, k/2))) * time.Millisecond
}

// allRetryQueues are the names of every retry queue group can have on topic.
func allRetryQueues(topic, group string) []string {
	var qs []string
	for k := bucketIndex(minRetryDelay); k <= bucketIndex(maxRetryDelay); k++ {
		qs = append(qs, retryQueue(topic, group, bucketDelay(k)))
	}
	return qs
}

func retryQueue(topic, group string, d time.Duration) string {
	return groupQueue(topic, group) + ":retry:" + strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// Nack implements driver.Nacker: each delivery is republished, with its
// next attempt number, to the group's retry queue for delay (a queue with
// that message TTL which dead-letters into the group's queue), and is
// acknowledged once the republish is confirmed. The republish is
// mandatory: one the server returns, because the retry queue is gone, is
// sent again after declaring the queue again, and fails if it is
// returned again. A delivery whose republish failed is not acknowledged;
// when some of the batch were republished and others not, the error is a
// *driver.MessageErrors saying which.
func (s *sub) Nack(ctx context.Context, ds []*driver.Delivery, delay time.Duration) error {
	if len(ds) == 0 {
		return nil
	}
	bucket := retryBucket(delay)
	q := retryQueue(s.topic, s.group, bucket)
	declare := func(ctx context.Context) error { return s.declareRetry(ctx, q, bucket) }
	results := make([]error, len(ds)) // per delivery; errNotTried until tried
	for i := range results {
		results[i] = errNotTried
	}
	todo := make([]int, len(ds)) // indexes into ds
	for i := range todo {
		todo[i] = i
	}
	for try := 1; len(todo) > 0; try++ {
		if err := declare(ctx); err != nil {
			for _, i := range todo {
				results[i] = err
			}
			break
		}
		b := &pbatch{errs: make([]error, len(todo)), done: make(chan struct{})}
		pms := make([]*pmsg, len(todo))
		for j, i := range todo {
			d := ds[i]
			pms[j] = &pmsg{key: q, mandatory: true, pub: encode(&d.Message, true, d.Attempt+1, true), b: b, i: j}
		}
		if err := s.c.publisher.publish(ctx, q, pms, b, true); err != nil {
			for _, i := range todo {
				results[i] = err
			}
			break
		}
		var again []int
		for j, err := range b.errs {
			i := todo[j]
			results[i] = err
			if err != nil && try == 1 && errors.Is(err, ErrUnroutable) {
				again = append(again, i)
			}
		}
		if len(again) > 0 {
			s.c.forget("q:" + q) // the declaration cache was wrong
		}
		todo = again
	}
	var ok []*driver.Delivery
	failed := 0
	for i, err := range results {
		if err == nil {
			ok = append(ok, ds[i])
		} else {
			failed++
			results[i] = fmt.Errorf("rabbitbus: nack %q group %q: not requeued: %w", s.topic, s.group, err)
		}
	}
	// An acknowledgement that fails leaves the original with the server,
	// which delivers it again: a duplicate of the republished copy, never
	// a loss. The republish counts.
	_ = s.Ack(ctx, ok)
	switch {
	case failed == 0:
		return nil
	case failed == len(ds):
		return results[0]
	}
	return &driver.MessageErrors{Errs: results}
}

// errNotTried marks a delivery of a Nack whose republish never started.
var errNotTried = errors.New("not tried")

// declareRetry declares q, the group's retry queue for delay bucket: a
// queue with that message TTL that dead-letters into the group's queue.
//
// A quorum retry queue dead-letters at least once: it keeps a message
// until the group's queue has confirmed it, so none is lost while that
// queue is unavailable, full or even gone (the server tries again). This
// needs the reject-publish overflow; the retry queue has no length limit,
// so it never rejects a publish for it. Classic queues dead-letter at
// most once.
//
// A throwaway group's retry queue expires once unused, EphemeralExpiry
// after its TTL: publishing does not count as use, so the queue is
// declared again (which does) at least every EphemeralExpiry/2, and a
// queue always outlives the messages published into it.
func (s *sub) declareRetry(ctx context.Context, q string, bucket time.Duration) error {
	args := s.c.queueArgs()
	args["x-message-ttl"] = bucket.Milliseconds()
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = s.lanes[0].queue
	if s.quorum {
		args["x-dead-letter-strategy"] = "at-least-once"
		args["x-overflow"] = "reject-publish"
	}
	var maxAge time.Duration
	if s.expires {
		args["x-expires"] = int32((bucket + EphemeralExpiry).Milliseconds())
		maxAge = EphemeralExpiry / 2
	}
	err := s.c.ensure(ctx, "q:"+q, maxAge, func(ch *amqp.Channel) error {
		s.c.record("q", q)
		_, err := ch.QueueDeclare(q, true, false, false, false, args)
		return err
	})
	if err != nil {
		return s.c.topologyError("declare retry queue", q, err)
	}
	return nil
}

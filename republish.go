package omnibus

// Publishing again: Client.Publish tries again, with the same message
// IDs, the messages whose publish failed with an error the transport
// marked ErrRetryable (the server cannot have acted) or ErrOutcomeUnknown
// (it may have), after a backoff, until they land, fail otherwise, or
// the context ends. It runs on the caller's goroutine and holds no lock.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// The backoff between tries of a publish (driver.Backoff: doubling,
// jittered): a broker that restarts or a leader that moves is back
// within seconds, and a publisher should not wait much longer than that.
const (
	republishFirst = 25 * time.Millisecond
	republishMost  = time.Second
)

// PublishRetry describes a publish tried again (see Client.Publish).
type PublishRetry struct {
	Topic string
	// IDs are the messages published again, in the order given.
	IDs []string
	// Attempt is the number of the try that failed, from 1.
	Attempt int
	// Err is why it failed: an error marked ErrRetryable or
	// ErrOutcomeUnknown (the first of the messages').
	Err error
	// Delay is the backoff before the next try.
	Delay time.Duration
}

// PublishRetryHook sees each publish tried again: once per try, with the
// messages tried again. That is Client.Publish's (and a Publisher's),
// and a consumer's dead letter whose publish failed with such an error:
// the engine tries it again after its backoff (where the transport keeps
// no message IDs, a dead letter whose outcome was unknown may then be in
// the dead-letter topic twice).
type PublishRetryHook interface {
	OnPublishRetry(PublishRetry)
}

// republishable reports whether a message that failed with err may be
// published again: the transport says the server cannot have acted, or
// that it does not know.
func republishable(err error) bool {
	return (errors.Is(err, ErrRetryable) || errors.Is(err, ErrOutcomeUnknown)) && !errors.Is(err, ErrClosed)
}

// publishRetrying publishes ms (the caller's arguments, in order) and
// publishes again, with the same IDs, those that failed republishably,
// until they land, fail otherwise, or ctx ends. Its result is the
// caller's: nil, a *PublishError naming the caller's positions, or an
// error applying to every message. direct is for callers that batch
// themselves (a Publisher): their publishes are never coalesced.
func (c *Client) publishRetrying(ctx context.Context, topic string, ms []*driver.Message, opts driver.PublishOptions, direct bool) error {
	var (
		index  []int            // positions of ms among the caller's; nil: the same
		failed []PublishFailure // failures for good, at the caller's positions
	)
	at := func(i int) int {
		if index == nil {
			return i
		}
		return index[i]
	}
	for attempt := 1; ; attempt++ {
		err := c.publish(ctx, topic, ms, opts, direct)
		if err == nil && failed == nil {
			return nil
		}
		// Which of ms to publish again, and why each failed.
		var again []int
		var why []error
		var pe *PublishError
		switch {
		case err == nil:
		case ctx.Err() != nil && !errors.As(err, &pe):
			if index == nil {
				return err
			}
			for i, m := range ms {
				failed = append(failed, PublishFailure{Index: at(i), ID: m.ID, Err: err})
			}
		case errors.As(err, &pe):
			for _, f := range pe.Failed {
				if ctx.Err() == nil && republishable(f.Err) {
					again, why = append(again, f.Index), append(why, f.Err)
				} else {
					f.Index = at(f.Index)
					failed = append(failed, f)
				}
			}
		case republishable(err):
			for i := range ms {
				again, why = append(again, i), append(why, err)
			}
		case index == nil:
			return err // the first try, for every message: as the transport said
		default:
			for i, m := range ms {
				failed = append(failed, PublishFailure{Index: at(i), ID: m.ID, Err: err})
			}
		}
		if len(again) == 0 {
			break
		}
		delay := driver.Backoff(attempt, republishFirst, republishMost)
		if stop := c.waitRepublish(ctx, topic, delay); stop != nil {
			if pe == nil && index == nil {
				return fmt.Errorf("%w (tried %d times; %w)", err, attempt, stop)
			}
			for j, i := range again {
				e := fmt.Errorf("%w (tried %d times; %w)", why[j], attempt, stop)
				failed = append(failed, PublishFailure{Index: at(i), ID: ms[i].ID, Err: e})
			}
			break
		}
		next := make([]*driver.Message, len(again))
		nextIndex := make([]int, len(again))
		ids := make([]string, len(again))
		for j, i := range again {
			next[j], nextIndex[j], ids[j] = ms[i], at(i), ms[i].ID
		}
		c.noteRepublish(PublishRetry{Topic: topic, IDs: ids, Attempt: attempt, Err: why[0], Delay: delay})
		ms, index = next, nextIndex
	}
	slicesSortFailures(failed)
	return &PublishError{Topic: topic, Failed: failed}
}

// waitRepublish waits delay before the next try. It returns why there is
// none: ctx ended, or will have ended by then, or the client closed.
func (c *Client) waitRepublish(ctx context.Context, topic string, delay time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < delay {
		return fmt.Errorf("the context's deadline comes before the next try: %w", context.DeadlineExceeded)
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return fmt.Errorf("the context ended: %w", context.Cause(ctx))
	}
	if err := c.checkOpen("publish", topic); err != nil {
		return fmt.Errorf("the client closed: %w", ErrClosed)
	}
	return nil
}

// noteRepublish tells the hooks and the log that r's messages are
// published again: a warning for a call's first retry, debug after.
func (c *Client) noteRepublish(r PublishRetry) {
	c.retryHooks(r)
	const msg = "publish failed; publishing again with the same IDs"
	if r.Attempt == 1 {
		c.logger.Warn(msg, "topic", r.Topic, "messages", len(r.IDs), "delay", r.Delay, "err", r.Err)
	} else {
		c.logger.Debug(msg, "topic", r.Topic, "messages", len(r.IDs), "attempt", r.Attempt, "delay", r.Delay, "err", r.Err)
	}
}

// retryHooks tells the PublishRetryHooks that r's messages are published
// again.
func (c *Client) retryHooks(r PublishRetry) {
	for _, h := range c.hooks.publishRetry {
		h.OnPublishRetry(r)
	}
}

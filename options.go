package omnibus

import (
	"context"
	"fmt"
	"time"

	"github.com/omnibus-go/omnibus/driver"
)

// Handler handles one message. Returning nil settles it (ack or commit);
// an error retries it after a backoff, up to MaxAttempts; an error wrapped
// with [Permanent] dead-letters it at once. A panic is recovered and
// counts as a retryable failure.
//
// The message belongs to the engine: the handler must not keep it, or
// anything it holds, after returning (the engine clears a settled message
// that a lane's watermark still holds, so that it costs no memory).
type Handler func(ctx context.Context, m *Message) error

// BatchHandler handles a batch of messages. Returning nil settles every
// message; a *BatchError settles those whose entry is nil and fails the
// others one by one; any other error fails the whole batch.
type BatchHandler func(ctx context.Context, ms []*Message) error

// BatchError reports per-message outcomes of a batch: Errs[i] is the
// outcome of the batch's message i.
type BatchError struct {
	Errs []error
}

func (e *BatchError) Error() string {
	n := 0
	for _, err := range e.Errs {
		if err != nil {
			n++
		}
	}
	return fmt.Sprintf("omnibus: %d of %d messages of the batch failed", n, len(e.Errs))
}

// Unwrap returns the failed messages' errors.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// StartAt is where a new consumer group starts reading.
type StartAt = driver.StartAt

// Start positions.
const (
	StartLatest   = driver.StartLatest
	StartEarliest = driver.StartEarliest
)

// Ordering is how the engine runs handlers inside a lane.
type Ordering int

const (
	// OrderDefault is OrderKey on transports whose lanes are ordered and
	// OrderNone on the others.
	OrderDefault Ordering = iota
	// OrderLane runs one message at a time per lane: strict lane order.
	OrderLane
	// OrderKey runs messages of one key in order, different keys
	// concurrently, so throughput can grow past the number of lanes.
	OrderKey
	// OrderNone runs messages fully concurrently, bounded by MaxInFlight.
	OrderNone
)

func (o Ordering) String() string {
	switch o {
	case OrderLane:
		return "lane"
	case OrderKey:
		return "key"
	case OrderNone:
		return "none"
	}
	return "default"
}

// ParseOrdering parses "lane", "key" or "none".
func ParseOrdering(s string) (Ordering, error) {
	switch s {
	case "lane":
		return OrderLane, nil
	case "key":
		return OrderKey, nil
	case "none":
		return OrderNone, nil
	case "", "default":
		return OrderDefault, nil
	}
	return 0, fmt.Errorf("ordering %q: want lane, key or none: %w", s, ErrInvalid)
}

// SubscribeOption configures a Consumer.
type SubscribeOption func(*consumerConfig) error

type consumerConfig struct {
	group          string
	ephemeral      bool
	startAt        StartAt
	ordering       Ordering
	maxInFlight    int
	maxBytes       int
	maxAttempts    int
	backoffMin     time.Duration
	backoffMax     time.Duration
	deadLetter     string
	drainTimeout   time.Duration
	consumers      int
	hooks          []Hook
	batchCount     int
	batchBytes     int
	batchPeriod    time.Duration
	commitTimeout  time.Duration
	commitInterval time.Duration
}

func defaultConsumerConfig(topic string) consumerConfig {
	return consumerConfig{
		maxInFlight:    256,
		maxBytes:       64 << 20,
		maxAttempts:    5,
		backoffMin:     100 * time.Millisecond,
		backoffMax:     10 * time.Second,
		deadLetter:     topic + ".dlq",
		drainTimeout:   30 * time.Second,
		consumers:      1,
		batchCount:     100,
		batchBytes:     1 << 20,
		commitTimeout:  10 * time.Second,
		commitInterval: 100 * time.Millisecond,
	}
}

func positive(name string, n int) error {
	if n <= 0 {
		return fmt.Errorf("omnibus: %s must be positive, got %d: %w", name, n, ErrInvalid)
	}
	return nil
}

func positiveDuration(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("omnibus: %s must be positive, got %v: %w", name, d, ErrInvalid)
	}
	return nil
}

// Group names the consumer group. Every group receives every message of
// the topic; members of one group share it. Default: a throwaway group
// unique to this consumer. Kafka: group.id; RabbitMQ: the queue;
// JetStream: the durable consumer name.
func Group(name string) SubscribeOption {
	return func(c *consumerConfig) error {
		if name == "" {
			return fmt.Errorf("omnibus: empty group name: %w", ErrInvalid)
		}
		c.group = name
		return nil
	}
}

// StartFrom sets where a group with no committed position starts.
// StartEarliest needs a transport that can replay. Default: StartLatest.
// Kafka: auto.offset.reset; JetStream: DeliverPolicy.
func StartFrom(s StartAt) SubscribeOption {
	return func(c *consumerConfig) error {
		if s != StartLatest && s != StartEarliest {
			return fmt.Errorf("omnibus: invalid start position %d: %w", int(s), ErrInvalid)
		}
		c.startAt = s
		return nil
	}
}

// Order sets the ordering mode. Default: OrderDefault (key order where
// lanes are ordered). OrderLane and OrderKey need ordered lanes.
func Order(o Ordering) SubscribeOption {
	return func(c *consumerConfig) error {
		if o < OrderDefault || o > OrderNone {
			return fmt.Errorf("omnibus: invalid ordering %d: %w", int(o), ErrInvalid)
		}
		c.ordering = o
		return nil
	}
}

// MaxInFlight bounds the messages received and not yet settled by one
// group member; at the bound the engine stops fetching. It also bounds
// handler concurrency. Messages waiting behind a retry of their key (or a
// dead letter that has not landed) do not count, so that one failing key
// does not stop the others; they count against MaxInFlightBytes, and a
// member holds at most 16 x MaxInFlight messages in all (on logs,
// settled ones included while an earlier one holds the lane's committed
// position back). Default: 256. RabbitMQ: the prefetch count;
// JetStream: MaxAckPending.
func MaxInFlight(n int) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positive("MaxInFlight", n); err != nil {
			return err
		}
		c.maxInFlight = n
		return nil
	}
}

// MaxInFlightBytes bounds the bytes (body, key, ID and headers) of
// messages received and not yet settled by one member: the engine asks the
// transport for no more than the room left. A message larger than the
// whole bound still passes, alone. What a transport prefetches below the
// engine is its own (see its package documentation). Default: 64 MiB.
func MaxInFlightBytes(n int) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positive("MaxInFlightBytes", n); err != nil {
			return err
		}
		c.maxBytes = n
		return nil
	}
}

// MaxAttempts is how many times a message is tried before it is
// dead-lettered. Default: 5. JetStream: MaxDeliver.
func MaxAttempts(n int) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positive("MaxAttempts", n); err != nil {
			return err
		}
		c.maxAttempts = n
		return nil
	}
}

// Backoff sets the retry delay: min after the first failure, doubling up
// to max, each delay jittered down by up to half. Default: 100ms, 10s.
func Backoff(min, max time.Duration) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positiveDuration("backoff minimum", min); err != nil {
			return err
		}
		if max < min {
			return fmt.Errorf("omnibus: backoff maximum %v below minimum %v: %w", max, min, ErrInvalid)
		}
		c.backoffMin, c.backoffMax = min, max
		return nil
	}
}

// DeadLetterTopic names where messages go when they fail permanently or
// run out of attempts. A message is settled only once its dead letter
// landed: one the topic refuses (a transient failure, or for good: too
// large even with its reason cut to fit, a topic that cannot exist, no
// permission) holds its key and is published again after a backoff, at
// most every BackoffMax, with an ERROR log and an
// EventDeadLetterFailed each time, while the other keys go on. Default:
// the topic's name followed by ".dlq".
func DeadLetterTopic(topic string) SubscribeOption {
	return func(c *consumerConfig) error {
		if topic == "" {
			return fmt.Errorf("omnibus: empty dead-letter topic: %w", ErrInvalid)
		}
		c.deadLetter = topic
		return nil
	}
}

// DrainTimeout bounds how long a revoked lane waits for its running
// handlers before the engine commits what is settled and lets the lane go
// (their results are then discarded and the messages redelivered), and how
// long Run drains when its context ends. Default: 30s.
func DrainTimeout(d time.Duration) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positiveDuration("DrainTimeout", d); err != nil {
			return err
		}
		c.drainTimeout = d
		return nil
	}
}

// CommitInterval is the least time between two commits of positions on
// logs: settled messages are committed together, at most this often, and
// at once when lanes are revoked or the consumer shuts down. A crash
// redelivers at most about this long's worth of settled messages.
// Acknowledgements on brokers are not delayed. Default: 100ms. Kafka: it
// takes the place of auto.commit.interval.ms.
func CommitInterval(d time.Duration) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positiveDuration("CommitInterval", d); err != nil {
			return err
		}
		c.commitInterval = d
		return nil
	}
}

// Members is the number of group members the consumer runs in this
// process. Default: 1. See package autoscale to size it from lag.
func Members(n int) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positive("Members", n); err != nil {
			return err
		}
		c.consumers = n
		return nil
	}
}

// Observe registers fn to receive every one of the engine's events:
// message outcomes, retries, dead letters, lane claims and revocations,
// commits and acknowledgements. It is a hook of every event kind, with
// the same contract (see Hook): fn runs on the engine's goroutines,
// outside its locks, and must be quick. Default: none.
func Observe(fn func(Event)) SubscribeOption {
	return func(c *consumerConfig) error {
		if fn == nil {
			return fmt.Errorf("omnibus: nil observer: %w", ErrInvalid)
		}
		c.hooks = append(c.hooks, observerHook(fn))
		return nil
	}
}

// Batch sets how a BatchHandler's batches form: at most count messages
// and bytes bytes, taken from what has arrived, as a Kafka poll returns
// what is buffered. A period above 0 lets a partial batch wait for more,
// up to period after its first message arrived (to fill batches from a
// trickle, at that much latency); it does not wait while no more can come
// (the member holds MaxInFlight messages or MaxInFlightBytes). While a
// batch runs, what arrives for its key (or lane) queues, so batches grow
// with the load by themselves. Batches form per key in OrderKey and per
// lane otherwise.
// Default: 100 messages, 1 MiB, period 0 (no waiting).
func Batch(count, bytes int, period time.Duration) SubscribeOption {
	return func(c *consumerConfig) error {
		if err := positive("batch count", count); err != nil {
			return err
		}
		if err := positive("batch bytes", bytes); err != nil {
			return err
		}
		if period < 0 {
			return fmt.Errorf("omnibus: batch period must not be negative, got %v: %w", period, ErrInvalid)
		}
		c.batchCount, c.batchBytes, c.batchPeriod = count, bytes, period
		return nil
	}
}

// Package driver defines the interface a transport implements to plug into
// omnibus. Users do not import it; transport authors do.
//
// The interface is small and batch-shaped on purpose: a driver does I/O and
// declares what its transport can do. Everything a user might want on top of
// that (retry with backoff, dead-lettering, ordering per key, offset
// watermarks, backpressure, batching, drain on shutdown, metrics) is written
// once, in package omnibus, above the drivers.
//
// # Delivery semantics
//
// A subscription is one member of a consumer group. The group's unit of
// parallelism is a lane: a Kafka partition, one of N
// partition queues on a broker, or the single unordered lane of a plain
// queue. The driver tells the engine which lanes the member holds through
// the [Lanes] callbacks given at subscribe time, and hands out deliveries in
// lane order through [Subscriber.Receive].
//
// Settlement comes in two forms, chosen by the optional interfaces a
// Subscriber implements:
//
//   - [Acker]: per-message acknowledgement (RabbitMQ, JetStream). A
//     transport that can also ask for redelivery implements [Nacker].
//   - [Committer]: a position per lane (Kafka offsets). The engine passes
//     the highest delivery of a lane below which every delivery is
//     settled, and the driver stores its position.
//
// Where the transport's delivery count cannot say how many holders ran a
// message (a message whose handler crashes its process is dead-lettered
// after MaxAttempts of them), a driver counts them itself:
// [AttemptKeeper] for a log's lanes, which count no deliveries, and
// [RunCounter] for a count that also counts holders that never ran the
// message.
//
// A driver never retries a failed operation on its own and never decides
// that a message is done: that is the engine's job.
//
// # Errors
//
// Drivers wrap the client library's error with %w so callers can reach it
// with errors.As, and wrap one of the sentinels in package omnibus/driver
// ([ErrNotFound], [ErrUnsupported], ...) where the condition matches, so
// package omnibus can classify it. [ErrRetryable] marks an error after which
// the server cannot have acted on the request, the same contract as
// database/sql/driver.ErrBadConn. [ErrOutcomeUnknown] marks an error after
// which the server may or may not have acted (the connection was lost
// between a publish and its confirm, a request timed out). Package
// omnibus publishes again, with the same message IDs, what failed with
// either mark; a driver marks nothing else that way, and says in its
// documentation whether a message published again can be stored twice.
//
// # Concurrency
//
// Conn methods may be called concurrently. A Subscriber's Receive is called
// from one goroutine at a time; its Ack, Nack, Commit and Lag may be called
// concurrently with Receive and with each other.
package driver

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strconv"
	"time"
)

// Sentinel errors a driver wraps so the portable layer can classify them.
// Package omnibus re-exports them under the same names.
var (
	ErrClosed      = errors.New("closed")
	ErrNotFound    = errors.New("not found")
	ErrUnsupported = errors.New("unsupported")
	ErrTooLarge    = errors.New("message too large")
	ErrRetryable   = errors.New("retryable")
	ErrInvalid     = errors.New("invalid argument")
	// ErrOutcomeUnknown: the request may or may not have taken effect.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// Driver opens connections for one URL scheme. It is registered with
// omnibus.Register from the transport package's init function.
type Driver interface {
	// Open connects to the transport named by u. The portable layer has
	// already removed the query parameters it owns (see omnibus.Open); the
	// driver rejects any parameter left that it does not know, wrapping
	// ErrInvalid. Open honours ctx for connection set-up only.
	Open(ctx context.Context, u *url.URL, opts OpenOptions) (Conn, error)
}

// OpenOptions are what the portable layer hands a driver beside the URL.
type OpenOptions struct {
	// Logger is the client's logger, already naming the transport; never
	// nil. The driver logs through it and wires its client library's
	// logging to it (warnings and errors, not the library's chatter).
	// Messages name what happened; the attributes say where.
	Logger *slog.Logger
}

// Conn is an open connection to one transport.
type Conn interface {
	// Capabilities reports what the transport guarantees. It is called
	// once, after Open, and must not change afterwards.
	Capabilities() Capabilities

	// Publish sends msgs to topic and waits for the durability asked for.
	// When the transport can fail one message of a batch, the driver
	// returns a *MessageErrors with one entry per message (nil for those that
	// landed); any other error applies to every message. Once Publish has
	// returned, even because ctx ended while the transport still has the
	// messages in flight, the driver reads nothing of msgs (their bodies
	// and headers above all): the caller may reuse them.
	Publish(ctx context.Context, topic string, msgs []*Message, opts PublishOptions) error

	// Subscribe joins the consumer group opts.Group on topic. The returned
	// Subscriber is one group member.
	Subscribe(ctx context.Context, topic string, opts SubscribeOptions) (Subscriber, error)

	// Close releases the connection. The portable layer closes every
	// Subscriber first and calls Close once.
	Close() error
}

// Queuer is implemented by a Conn whose client keeps its own window of
// publishes in flight, in order, and rides through faults by itself
// without reordering (franz-go's idempotent producer). Queue hands msgs to
// that window and returns once they are queued behind everything queued
// before, without waiting for their outcome (it may wait for room in the
// client's buffer, bounded by ctx); done is then called once, on one of
// the client's goroutines, with what Publish would have returned. done
// must not block. An error from Queue means nothing was queued and done
// is not called. The driver may read msgs until it calls done, not after.
//
// The portable layer's Publisher queues its batches through it instead
// of waiting for each (a Publish per batch), and does not publish again
// what done reports failed: the client has already tried for as long as
// its delivery timeout allows, and a second try would land after
// messages queued since.
type Queuer interface {
	Queue(ctx context.Context, topic string, msgs []*Message, opts PublishOptions, done func(error)) error
}

// Message is a message as the driver puts it on, and takes it off, the
// wire. The portable layer fills ID and Time before publishing. Drivers
// whose transport has headers map it onto the transport's CloudEvents
// binding with a [Binding].
type Message struct {
	ID          string
	Key         string
	Type        string
	Source      string
	Time        time.Time
	ContentType string
	Headers     map[string]string
	Body        []byte
}

// Size is the number of bytes the message occupies in the engine's
// accounting: body, key and headers.
func (m *Message) Size() int {
	n := len(m.Body) + len(m.Key) + len(m.ID) + len(m.Type) + len(m.Source) + len(m.ContentType)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	return n
}

// Delivery is a message received on a lane. After Receive returns it, the
// engine owns the Delivery and hands it back to Ack, Nack or Commit.
type Delivery struct {
	Message

	// Lane identifies the lane the delivery came from, as announced by
	// Lanes.Claimed.
	Lane string
	// Position is the delivery's place in the lane in the transport's own
	// terms (a Kafka offset, a stream sequence).
	// It is informational: the engine orders deliveries by the order
	// Receive returned them and never compares positions.
	Position string
	// Attempt is the number of times the transport has delivered this
	// message, starting at 1, when the transport counts redeliveries; 0
	// when it does not.
	Attempt int
	// Redelivered says that the transport delivered the message before to
	// a holder that neither settled it nor handed it back for a retry (its
	// channel closed, its process died). The engine then handles the lane
	// one message at a time for a while (see AttemptKeeper), so that a
	// message that crashes its process is counted alone. A driver that
	// cannot tell such a redelivery from a retry the engine asked for
	// (Nacker) leaves it false; where the engine does not nack, an
	// Attempt above 1 says the same.
	Redelivered bool

	// Token is the driver's own handle (a delivery tag, a record). The
	// engine never looks at it.
	Token any
}

// Durability is how far a publish must get before it counts as done.
type Durability int

const (
	// DurabilityAll waits until every replica has the message (Kafka
	// acks=all, RabbitMQ publisher confirms of a persistent message,
	// JetStream publish acks).
	DurabilityAll Durability = iota
	// DurabilityLeader waits until the leader has the message (Kafka
	// acks=1); transports without replicas treat it as DurabilityAll.
	DurabilityLeader
	// DurabilityNone does not wait for the server (Kafka acks=0, RabbitMQ
	// without confirms, core NATS publish).
	DurabilityNone
)

func (d Durability) String() string {
	switch d {
	case DurabilityAll:
		return "all"
	case DurabilityLeader:
		return "leader"
	case DurabilityNone:
		return "none"
	}
	return "durability(" + strconv.Itoa(int(d)) + ")"
}

// PublishOptions are the settings of one Publish call.
type PublishOptions struct {
	Durability Durability
	// DeadLetter is set when the engine dead-letters to topic. The driver
	// makes sure the topic exists and keeps what is published to it even
	// when no consumer group reads it yet (a Kafka topic, a RabbitMQ queue
	// bound to the exchange), whatever the topic's name.
	DeadLetter bool
}

// StartAt is where a new consumer group starts reading.
type StartAt int

const (
	// StartLatest reads only messages published after the group is created.
	StartLatest StartAt = iota
	// StartEarliest reads every message the transport still holds
	// (requires Capabilities.Replay).
	StartEarliest
)

// SubscribeOptions are the settings of one group member.
type SubscribeOptions struct {
	// Group names the consumer group. Never empty: the portable layer
	// generates a name when the user gives none, and sets Ephemeral.
	Group string
	// Ephemeral is true when the group was not named by the user and
	// nobody will resume it: the driver may use a consumer the server
	// removes when the member leaves (or soon after).
	Ephemeral bool
	// StartAt applies when the group has no committed position yet.
	StartAt StartAt
	// MaxInFlight is the engine's bound on messages received and not yet
	// settled. Brokers that push use it as their prefetch.
	MaxInFlight int
	// MaxInFlightBytes is the engine's bound on the bytes (Message.Size)
	// of those messages. Drivers that can cap what they prefetch by size
	// use it for that cap.
	MaxInFlightBytes int
	// MaxHeld is the most deliveries the engine holds unsettled: those in
	// flight and those waiting behind a retry of their key, which do not
	// count against MaxInFlight. A transport that stops delivering at a
	// count of unacknowledged messages (a prefetch) and whose lanes are
	// ordered needs at least this much, or one retrying key stalls the
	// others of its lane.
	MaxHeld int
	// Lanes receives lane claims and revocations. Never nil.
	Lanes Lanes
}

// Lanes is implemented by the engine and called by the driver when the
// group member gains or loses lanes.
//
// Claimed is called before Receive returns any delivery of the lane.
//
// Revoked blocks until the engine has stopped working on the lanes,
// finished or abandoned what was in flight within its drain bound, and
// committed what was settled (it calls Commit from inside Revoked); after
// it returns the engine makes no further call for those lanes, and Receive
// must not return deliveries of the old claim.
//
// Lost is for lanes taken away without the chance to commit (a session
// expired); the engine abandons them at once.
//
// Revoked and Lost first wait for a Receive in progress to return, so that
// what it read is handled as part of the old claim; from then until they
// have marked the lanes, the engine starts no Receive. The Receive waited
// for must therefore return promptly (with what it has, possibly nothing):
// the engine calls [Waker.Wake] once it waits, and a driver whose Receive
// can wait implements Waker. Waking Receive before calling Revoked or Lost
// is not enough: the engine may start another Receive in between, which
// nothing wakes. A Receive that does not return delays the revocation by
// up to the drain bound (Lost: a second), after which deliveries of
// revoked lanes from that Receive are dropped. While the revoked lanes
// drain, the engine goes on calling Receive for the lanes that stay, and
// drops any delivery of a revoked lane it gets.
//
// The driver calls Claimed and Revoked from one goroutine at a time. Lost
// may be called at any time, also while a Revoked of other lanes is in
// progress: a lease that runs out must reach the engine at once, not
// behind another lane's drain. None is called from the goroutine running
// Receive, nor while holding a lock that Receive, Ack or Commit needs.
type Lanes interface {
	Claimed(lanes []string)
	Revoked(ctx context.Context, lanes []string)
	Lost(lanes []string)
}

// Subscriber is one member of a consumer group.
//
// A Subscriber must also implement Acker or Committer.
type Subscriber interface {
	// Receive blocks until at least one delivery is available and returns
	// what of it fits in room (see [Room]), in lane order; what does not
	// fit stays in the driver, first in line for the next Receive. It may
	// return no delivery and no error (after a revocation, or when the
	// first delivery waiting does not fit); the engine calls it again. It
	// returns ctx.Err() when ctx ends and an error wrapping ErrClosed
	// after Close.
	Receive(ctx context.Context, room Room) ([]*Delivery, error)

	// Close leaves the group. Unsettled deliveries go back to the
	// transport: brokers redeliver them, logs resume from the last commit.
	// Close is called once, after the engine has committed what it could.
	Close() error
}

// Waker is implemented by a Subscriber whose Receive can wait (for a
// message, for a server's answer). The engine calls Wake when it needs
// the Receive in progress to end: a revocation or a loss of lanes waits
// for it (see [Lanes]). That Receive then returns promptly, with what it
// has or nothing; when Wake comes as it returns anyway, the next Receive
// may return at once, empty. Wake does not block and is called from any
// goroutine, never while the engine holds a lock that Receive needs.
type Waker interface {
	Wake()
}

// Room is how much one Receive may return: the engine's bounds on
// messages and bytes in flight, less what it holds.
type Room struct {
	// Count is the most deliveries to return; at least 1.
	Count int
	// Bytes is the most the deliveries' sizes (Message.Size) may add up
	// to.
	Bytes int
	// Oversize lets a first delivery larger than Bytes through, alone.
	// The engine sets it when it holds nothing, so that a message larger
	// than its whole bound still passes; without it such a delivery waits
	// in the driver.
	Oversize bool
}

// Fits reports whether a delivery of size bytes may join n deliveries of
// bytes bytes already taken for one Receive.
func (r Room) Fits(n, bytes, size int) bool {
	switch {
	case n >= r.Count:
		return false
	case n == 0 && r.Oversize:
		return true
	}
	return bytes+size <= r.Bytes
}

// Acker settles deliveries one by one (brokers).
type Acker interface {
	Ack(ctx context.Context, ds []*Delivery) error
}

// Nacker asks the transport to deliver again after delay. Only transports
// with native redelivery implement it. The delivery may come back to any
// member of the group, so the engine uses Nack only when the subscription
// does not promise order. When the transport can fail some deliveries of
// the batch, Nack returns a *MessageErrors with one entry per delivery (nil
// for those handed back); the engine retries the others itself. Any other
// error applies to every delivery.
type Nacker interface {
	Nack(ctx context.Context, ds []*Delivery, delay time.Duration) error
}

// Committer stores positions (logs). Each delivery passed is the highest
// settled one of its lane, with every earlier delivery of that lane also
// settled; at most one per lane per call. The driver stores the position
// after it, so that a restart resumes at the first unsettled message.
type Committer interface {
	Commit(ctx context.Context, ds []*Delivery) error
}

// AttemptKeeper is implemented by a Committer whose transport does not
// count a message's deliveries across the holders of its lane (a Kafka
// partition, whoever the group assigns it to). It keeps, where the lane's
// next holder finds it, how many holders began handling the lane's first
// unsettled message without settling it, so that a message whose handler
// crashes its process each time is dead-lettered after MaxAttempts
// processes instead of never.
//
// The driver reads a claim itself: the first delivery of a claimed lane
// at its committed position gets Attempt = the holders that began it
// before, plus one. When none did, the driver records this holder's
// claim before Receive returns it, and the Attempt is 1. When some did,
// it records nothing: the delivery is a suspect, and the engine calls
// Begin when it is about to run it, so a holder that dies before it ran
// the message (running another suspect) does not count against it.
// Other deliveries have Attempt 0. When a delivery's Attempt is above 1,
// the engine guards the lane for a while: it hands out the lane's
// messages one at a time, commits the lane up to each before it runs,
// and calls Begin for each, so that a process that dies leaves the
// committed position on the message that killed it, with its count.
type AttemptKeeper interface {
	// Begin records that d, the lane's committed position (every earlier
	// delivery of the lane is settled and committed), is about to be
	// handled, and returns how many holders began it, this one included.
	Begin(ctx context.Context, d *Delivery) (int, error)
}

// RunCounter is implemented by an Acker whose transport counts a
// message's deliveries (Attempt) but also counts those to holders that
// never ran it: the messages a crashed process had received and held
// behind the one that killed it, or a pull the server answered after its
// client died. Such a count reaches MaxAttempts for a message that never
// crashed anything. The driver keeps, where every member of the group
// finds it, how many holders ran each redelivered message.
//
// The engine calls CountRun when it is about to run a delivery whose
// Attempt is above 1 (everything the member settled before is
// acknowledged), and takes the count it returns for the delivery's
// Attempt. A delivery with Attempt 1 is not counted: its first holder
// ran it or not, unrecorded, and CountRun counts it as having run.
type RunCounter interface {
	// CountRun records that this holder is about to run d and returns
	// how many holders ran it, this one and the first included.
	CountRun(ctx context.Context, d *Delivery) (int, error)
}

// LagReader reports the group's lag per lane: every lane of the topic the
// transport can tell about, and at least the lanes this member holds.
type LagReader interface {
	Lag(ctx context.Context) ([]LaneLag, error)
}

// GroupLagReader is implemented by a Conn that can read a consumer group's
// lag on every lane of a topic without joining the group (joining would
// take lanes from the group's members). It returns an error wrapping
// ErrNotFound when the topic or the group does not exist.
type GroupLagReader interface {
	GroupLag(ctx context.Context, topic, group string) ([]LaneLag, error)
}

// GroupMembersReader is implemented by a Conn that can count the members
// of a consumer group across every process (a Kafka group's members, the
// live leases of a JetStream group, the consumers of a RabbitMQ queue),
// without joining the group. The autoscaler uses it to take the group's
// view: each process sizes itself to its share of what the group needs,
// so that two processes do not both add what the group lacks. It returns
// an error wrapping ErrNotFound when the group does not exist, and one
// wrapping ErrUnsupported when it cannot tell at the moment.
type GroupMembersReader interface {
	GroupMembers(ctx context.Context, topic, group string) (int, error)
}

// LaneLag is the lag of one lane. Known is false when the transport could
// not say (a failed read, a group with no position yet on a transport that
// cannot tell); an unknown lag is never reported as zero.
//
// # Age
//
// Age is how long the lane's oldest unsettled message has waited: the
// time of the read minus the time the message was appended (or, where the
// transport keeps only the publisher's time, published). It is the lag in
// time, which a target of the form "no message waits longer than a
// minute" needs and a count of records cannot give. A transport that
// reports it sets Capabilities.Age and fills Age on every lane it can
// tell about, with AgeKnown true; a lane with nothing unsettled has Age 0
// and AgeKnown true. Where it cannot tell (the head of a queue the
// broker does not show, a failed read) AgeKnown stays false: an unknown
// age is never reported as zero. Set both with [LaneLag.SetAge].
//
// Where each transport finds the oldest unsettled message:
//
//   - membus: the append time of the record at the committed offset.
//   - Kafka: the timestamp of the record at the committed offset (or the
//     log start, where the group has committed nothing), fetched once per
//     committed offset: the time the record was produced (appended, on a
//     topic with LogAppendTime).
//   - JetStream: the stream's time of the first message at or after the
//     consumer's ack floor + 1 on the consumer's filter subject.
//   - RabbitMQ: the oldest delivery the client's members hold on the lane
//     (a queue hands out its head first), 0 when the queue is empty and
//     no other process consumes it; unknown otherwise, since AMQP cannot
//     show the head of a queue without taking it.
//   - Redis Streams: the smallest entry ID pending for the group (XPENDING;
//     an ID is the server's append time in milliseconds), else the first
//     entry after the group's last-delivered-id.
//   - NSQ: as RabbitMQ, from the oldest in-flight message this client
//     holds (the message's nsqd timestamp), where every message in
//     flight is held here and the channel never requeued, timed out or
//     spilled to disk (so those waiting are newer); 0 when the channel
//     has no lag; unknown otherwise.
//   - Kinesis: the ApproximateArrivalTimestamp of the first record after
//     the group's checkpoint (at least the MillisBehindLatest Kinesis
//     reports for it), read from outside the group; the lag in time is
//     the same number (LagMillis).
//
// Clocks of different machines may disagree: an age is never negative,
// and one computed against a server's clock is off by the skew.
type LaneLag struct {
	Lane  string
	Lag   int64
	Known bool

	Age      time.Duration
	AgeKnown bool

	// Committed is the group's position on the lane where the transport
	// counts positions with integers that rise as the group settles
	// messages (a Kafka committed offset, a JetStream ack floor, a
	// membus offset); 0 where it does not. Only its movement means
	// something: a rise is progress, seen from outside the group.
	Committed int64
}

// SetAge records that the lane's oldest unsettled message was appended at
// oldest, as seen at now: Age is now minus oldest, never negative.
func (l *LaneLag) SetAge(now, oldest time.Time) {
	l.Age, l.AgeKnown = max(now.Sub(oldest), 0), true
}

// TopicCreator creates a topic with n lanes when it does not exist. Drivers
// whose topics need creating implement it.
type TopicCreator interface {
	CreateTopic(ctx context.Context, topic string, lanes int) error
}

// MessageErrors reports per-message failures of a Publish or a Nack. Errs
// has one entry per message of the batch, nil for those that succeeded.
type MessageErrors struct {
	Errs []error
}

func (e *MessageErrors) Error() string {
	n := 0
	var first error
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	if first == nil {
		return "no message failed"
	}
	return strconv.Itoa(n) + " of " + strconv.Itoa(len(e.Errs)) + " messages failed, first: " + first.Error()
}

// Unwrap returns the individual errors, so errors.Is matches any of them.
func (e *MessageErrors) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

package omnibus

import "time"

// EventKind says what an Event reports.
type EventKind int

// Event kinds.
const (
	// EventProcessed: a handler succeeded and the message is settled.
	EventProcessed EventKind = iota + 1
	// EventFailed: an attempt failed (Err says why); a retry or a dead
	// letter follows.
	EventFailed
	// EventRetried: the message will run again after Delay.
	EventRetried
	// EventDeadLettered: the message went to the dead-letter topic.
	EventDeadLettered
	// EventClaimed: the member gained Lanes.
	EventClaimed
	// EventRevoked: the member gave up Lanes after draining them.
	EventRevoked
	// EventLost: the member lost Lanes without the chance to commit.
	EventLost
	// EventCommitted: positions of Lanes were committed (logs).
	EventCommitted
	// EventDeadLetterFailed: a dead letter could not be published (Err
	// says why); the message holds its key and is tried again later.
	EventDeadLetterFailed
	// EventAcked: Count messages were acknowledged (brokers).
	EventAcked
)

var eventNames = [...]string{"", "processed", "failed", "retried", "dead-lettered", "claimed", "revoked", "lost", "committed", "dead-letter-failed", "acked"}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one thing the engine did, for metrics, tracing and scaling.
type Event struct {
	Kind  EventKind
	Topic string
	Group string
	// Member is the index of the group member inside the consumer.
	Member int
	// Lane is the lane of a message event.
	Lane string
	// Lanes are the lanes of a claim, revocation, loss or commit.
	Lanes []string
	// Message is the message of a message event. It must not be kept.
	Message *Message
	// Err is the failure of EventFailed, EventDeadLettered and
	// EventDeadLetterFailed.
	Err error
	// Latency is the handler's run time for EventProcessed and EventFailed.
	Latency time.Duration
	// Delay is the backoff of EventRetried.
	Delay time.Duration
	// Count is the number of messages of EventAcked and of lanes of
	// EventCommitted.
	Count int
}

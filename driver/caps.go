package driver

// Capabilities is what a transport can and cannot do. The portable layer
// checks requests against it when a subscription starts, and the
// conformance suite asserts it.
type Capabilities struct {
	// Ordered is true when a lane delivers in order to one member at a
	// time (Kafka partitions, partition queues with a
	// single active consumer). When false, lanes are competing-consumer
	// queues and no order is promised.
	Ordered bool
	// Lag is what the transport's lag counts; LagNone when it cannot tell.
	Lag LagKind
	// Age is true when the transport reports the age of each lane's
	// oldest unsettled message (LaneLag.Age), on the lanes it can tell
	// about (see LaneLag).
	Age bool
	// ExclusiveLanes is true when a lane is read by one member of a group
	// at a time (a Kafka partition, a partition queue), so that the
	// number of lanes caps the number of members that get work.
	ExclusiveLanes bool
	// Groups is true when several consumer groups each receive every
	// message of a topic.
	Groups bool
	// Replay is true when a new group can start from the earliest message
	// the transport still holds.
	Replay bool
	// MaxMessageBytes is the largest message the transport accepts by
	// default, 0 when it does not say.
	MaxMessageBytes int
}

// LagKind is the unit of a transport's lag.
type LagKind int

const (
	// LagNone: the transport cannot report lag.
	LagNone LagKind = iota
	// LagRecords: messages between the committed position and the end of
	// the lane (Kafka, membus).
	LagRecords
	// LagMillis: milliseconds behind the newest record (Kinesis).
	LagMillis
	// LagDepth: messages pending delivery or acknowledgement (RabbitMQ
	// queue depth, JetStream num_pending + num_ack_pending).
	LagDepth
)

func (k LagKind) String() string {
	switch k {
	case LagRecords:
		return "records"
	case LagMillis:
		return "millis"
	case LagDepth:
		return "depth"
	}
	return "none"
}

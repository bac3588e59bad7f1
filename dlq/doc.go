// Package dlq lists, views, replays and deletes the dead letters of a
// dead-letter topic, on every transport.
//
// The engine dead-letters a message to "<topic>.dlq" (by default) with
// headers saying why (omnibus.HeaderDeadReason and the others); a
// DeadLetter is such a message with those headers parsed.
//
//	q, _ := dlq.New(client, "orders.dlq")
//	l, _ := q.List(ctx, dlq.ListOptions{Filter: dlq.Filter{Reason: "timeout"}})
//	p, err := q.Replay(ctx, dlq.ReplayOptions{Filter: dlq.Filter{IDs: ids}})
//
// The omnibus command's dlq subcommands (list, show, replay, delete) and
// its console are built on this package.
//
// # How the dead letters are read
//
// The tools read a dead-letter topic as one consumer group, named after
// the topic (Group): a fresh group starts at the earliest message the
// transport keeps. Its position is what the tools took away: what
// Replay and Delete settle leaves the group (a broker's acknowledgement,
// a log's committed position), what List reads it leaves there. List
// settles nothing: it reads the messages the group has left and lets
// them go back when it ends. Other groups of the dead-letter topic, if
// any, are not touched. Run one tool at a time per dead-letter topic:
// two would share the group's messages or lanes between them.
//
// It reads through the transport's driver, not a consumer: it holds
// what it reads unsettled (up to ListOptions.Scan, or Bounds.Window
// and WindowBytes), settles what it replayed or deleted, and never
// retries or dead-letters anything.
//
// What List costs and does, per transport:
//
//	transport  what the tools' group is                       a List
//	Kafka      a consumer group, committed offsets            joins the group, fetches the messages, commits nothing
//	membus     a group, committed offsets                     as Kafka, in memory
//	JetStream  a durable consumer (per partition with leases) fetches them; they go back unacknowledged (Nak) at the end
//	Redis      a consumer group of the stream(s)              reads them into the group's pending list, handed back at the end
//	RabbitMQ   the dead-letter queue itself (the one named    consumes them unacknowledged; the channel's close requeues
//	           after the topic, which keeps the dead letters)   them, in place, with the redelivered flag set
//	Kinesis    a lease table and checkpoints, per shard       takes the shards' leases, reads, checkpoints nothing
//	NSQ        the channel named after the topic (the first   as RabbitMQ: in flight while read, requeued at the end
//	           channel gets what the topic kept)
//
// The tests run on all of them but NSQ.
//
// Each List reads up to the end (or ListOptions.Limit matches), so it
// costs a transfer of the dead letters left; while it runs, the messages
// it holds are invisible to anyone else reading the same group. A read
// ends when the group's lag says it holds everything left; where the lag
// is not a count (Kinesis: a time), when nothing came for a second after
// the first delivery, or, before any, once no shard has a record waiting
// after the group's checkpoint. Count is a lag read only, and unknown on
// Kinesis.
//
// # What Replay and Delete leave
//
// A broker (RabbitMQ, JetStream, Redis, NSQ) settles each message by
// itself: what is replayed or deleted is acknowledged and gone; the rest
// stays where it was.
//
// A log (Kafka, membus, Kinesis) settles by position: the group's
// committed position passes a lane's messages in order, and cannot pass
// one that was not selected. So that the topic keeps exactly the dead
// letters not selected, the unselected ones before the last selected one
// of a lane are first appended to the topic again (same ID, headers and
// body; Progress.Moved counts them) and the position then passes them
// all. Their old copies remain in the log until its retention removes
// them, behind the position, where no tool reads them. A replay that
// selects a run from the start of each lane (every message, or the
// oldest) moves nothing.
//
// # Replays
//
// A replay publishes the message as it was first published (key, type,
// source, time, headers, body; a large body whole), without the
// dead-letter headers, with HeaderReplayedID, HeaderReplayedFrom,
// HeaderReplayedAt and HeaderReplays added, under the ID of the replay
// (DeadLetter.ReplayID: the original ID and "-r1", "-r2"...). The
// original ID is not reused because JetStream drops a message whose ID
// it saw within its duplicate window (two minutes by default), and a
// replay must not vanish that way.
//
// Each dead letter is published at most once per Replay and settled
// after it landed, batch by batch; a failure of the publish settles
// nothing of what failed. A replay stopped (its context cancelled)
// finishes the batch it is publishing and settles it. What a crash
// between a publish and its settlement leaves is a dead letter still
// there whose replay landed: a later replay publishes it again under the
// same replay ID.
//
// A replay checks that its target topic exists, where the transport can
// tell (Kafka, RabbitMQ, JetStream, Redis), and stops before publishing
// anything there when it does not; on Kinesis the publish fails, and
// nothing is settled. On a transport without replay
// (RabbitMQ, NSQ), which keeps a message only for the groups that exist
// when it arrives, a replay to a dead letter's origin topic also checks
// that its origin group still reads the topic. On RabbitMQ a topic whose
// exchange has no queue drops what it gets: the omnibus command opens
// RabbitMQ URLs with mandatory=true for its replays, so that such a
// publish fails instead.
//
// # Errors
//
// A dead-letter topic that does not exist (where the transport tells)
// and a target topic that does not exist are errors wrapping
// omnibus.ErrNotFound; a replay to the dead-letter topic itself wraps
// omnibus.ErrInvalid.
//
// # Concurrency
//
// A Queue's methods may be called from any goroutine; they run one at a
// time. Progress is called on the goroutine running Replay or Delete.
// Close the Queue's client only after its calls returned.
package dlq

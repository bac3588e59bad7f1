// Package membus is omnibus's in-memory transport, scheme mem://: a
// partitioned log with the semantics of a real one, for tests and for
// programs that want the omnibus API inside one process.
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/membus"
//
//	c, err := omnibus.Open(ctx, "mem://orders?partitions=8")
//
// # URL
//
//	mem://[name][?partitions=N][&max_bytes=B]
//
// Clients opened with the same name share one bus (topics, groups,
// offsets); the bus lives while a client of it is open. An empty name is
// the bus "default".
//
//	parameter   default   meaning
//	partitions  4         lanes of a topic created on first use
//	max_bytes   8388608   largest message accepted (ErrTooLarge above it)
//
// Use [New] for a private bus without a URL.
//
// # Delivery semantics
//
// A topic has N partitions; a message's key picks its partition (FNV-1a,
// empty keys round-robin). Every consumer group receives every message;
// inside a group each partition is read by one member at a time, and
// partitions are rebalanced when members join or leave: the old owner's
// engine drains and commits before the new owner starts reading from the
// committed offset; a member's partitions take turns, each an equal
// share of what one Receive may return. A new group starts at the end of
// each partition, or at offset 0 with StartEarliest. Commits from a
// member that no longer owns the partition are rejected. Lag is the
// partition's end offset minus the committed offset, in records; its age
// is the time since the record at the committed offset was appended, by
// Config.Clock (exact: give a fake clock to test with time lag). The group's members are counted across
// every client of the bus. Nothing is ever deleted while the bus is open.
// A publish succeeds or fails for good (too large, closed): it is never
// marked for omnibus.Publish to try again, so it never stores a message
// twice.
//
//	capability       membus
//	ordered lanes    yes (partitions)
//	lag              records, and age
//	lane cap         yes
//	groups           yes
//	replay           yes
//	native nack      no (the engine retries)
//
// # Concurrency
//
// Everything is safe for concurrent use.
package membus

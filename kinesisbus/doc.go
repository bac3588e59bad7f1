// Package kinesisbus is omnibus's Amazon Kinesis Data Streams transport,
// scheme kinesis://, built on the AWS SDK for Go v2 (service/kinesis and
// service/dynamodb), with the Kinesis Client Library's coordination
// written in Go: shard leases and checkpoints in a DynamoDB table in the
// KCL's own schema, balanced by count, and the split and merge barrier.
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/kinesisbus"
//
//	c, err := omnibus.Open(ctx, "kinesis://us-east-1")
//
// # URL
//
//	kinesis://[KEYID:SECRET@]region[?param=value&...]
//
// The host is the AWS region. Credentials come from the SDK's default
// chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the shared files
// and their profile, a web identity, an instance role) unless the URL has
// static keys; the secret key never appears in an error (URLs are
// redacted). Unknown parameters are an error.
//
//	parameter            default            AWS's or the KCL's name / meaning
//	endpoint             the region's       Kinesis endpoint URL (endpoint_url,
//	                                        AWS_ENDPOINT_URL_KINESIS), for an emulator
//	dynamodb_endpoint    endpoint, else     DynamoDB endpoint URL (AWS_ENDPOINT_URL_DYNAMODB)
//	                     the region's
//	profile              (default chain)    the shared configuration's profile (AWS_PROFILE)
//	lease_table          {stream}.{group}   the KCL's tableName (applicationName): the
//	                                        lease table; {stream} and {group} are replaced
//	failover_time        10s                failoverTimeMillis: a lease whose counter does
//	                                        not move for this long has expired
//	shard_sync_interval  1m                 shardSyncIntervalMillis: how often the shards
//	                                        are listed (a shard that ends syncs at once)
//	poll_interval        1s                 idleTimeBetweenReadsInMillis: the wait after
//	                                        a GetRecords that found the shard caught up
//	max_records          10000              maxRecords: GetRecords' Limit
//	create_streams       dlq                which streams Publish and Subscribe create on
//	                                        first use: none, dlq (dead-letter streams), all
//	shards               1                  ShardCount of streams created on first use
//	max_message_bytes    783360             the largest message Publish sends (larger ones
//	                                        fail with ErrTooLarge): what any body fits in
//	                                        a 1 MiB record, base64 included, or less
//	request_timeout      30s                apiCallAttemptTimeout: the most one call to
//	                                        Kinesis or DynamoDB takes, whatever its
//	                                        context (a member's own calls have tighter
//	                                        bounds, from failover_time)
//
// The portable layer reads durability for every transport; Kinesis has
// no acknowledgement levels, so every level waits for PutRecords' answer
// (a record is then stored in three availability zones).
//
// # Messages on the wire
//
// Kinesis records have no headers: a message is a CloudEvent in
// structured content mode, the JSON event format
// (application/cloudevents+json), in the record's data, so any
// CloudEvents reader understands it. Its Key is the partition key (the
// ID when the Key is empty; a key over 256 characters is replaced by its
// SHA-256) and the partitionkey extension.
//
//	field        event
//	ID           id
//	Key          partitionkey, and the record's partition key
//	Type         type
//	Source       source
//	Time         time (RFC 3339 with nanoseconds)
//	ContentType  datacontenttype
//	Body         data (JSON content as JSON, other text as a string),
//	             else data_base64
//	             specversion: 1.0
//	Headers      an extension per header whose name is an attribute name
//	             ("tenant"); the others ("trace-id") together in the
//	             extension omnibusheaders, a JSON object in a string
//
// A record of another producer that is not such an event is delivered as
// it is: Body the data, Key the partition key, Time the arrival time, and
// the ID "<stream>/<shard ID>/<sequence number>", the same every time the
// record is read.
//
// # Leases and checkpoints
//
// A group's state is its lease table, one item per shard, with the KCL's
// attribute names: leaseKey (the shard ID), leaseOwner, leaseCounter,
// checkpoint (a sequence number, or TRIM_HORIZON, LATEST, AT_TIMESTAMP,
// SHARD_END), checkpointSubSequenceNumber, ownerSwitchesSinceCheckpoint,
// parentShardId, checkpointOwner, startingHashKey, endingHashKey. A group
// can therefore move from a Java KCL application to omnibus (or back) and
// keep its place: name the application's table with lease_table. The
// table is created on first use (on-demand capacity); a table of another
// shape is refused with ErrInvalid. An AT_TIMESTAMP checkpoint (where a
// new group at StartLatest begins) keeps its time in omnibusStartTime,
// which the KCL ignores. The table of a group omnibus named itself (no
// Group option) is deleted when its last member leaves.
//
// For tools, the connection (omnibus.Client.Driver) has TopicExists (the
// stream, in any state), DeleteTopic (the stream, with its records) and
// DeleteGroup (the group's lease table, in
// DynamoDB apart from the stream), each waiting until the service no
// longer knows it; a stream or table that does not exist is no error.
// The CLI's bench and demo remove what they made with them.
//
// A lease table deleted under running members (DeleteGroup, an operator)
// is created again by them. A member finds it missing at its next look
// at the table (at once when a renewal or a checkpoint gets
// ResourceNotFoundException), reports the lanes it held lost (Lanes.Lost:
// nothing is committed, there is nowhere to), creates the table as
// Subscribe does and the shards' leases where a new group starts, and
// takes them again. The leases created again belong to no member
// (leaseOwner omnibus-restored) until they expire, failover_time after a
// member first sees them, so that a member still reading a shard under
// the lease that was deleted finds out and stops before another takes
// it, as when a lease expires: nothing is read for failover_time to about
// twice that after the deletion. Reading goes on from where a new group
// starts, as the checkpoints went with the table: with StartEarliest from
// TRIM_HORIZON, so every record the stream still keeps is delivered
// again, those handled included; with StartLatest from the time the
// leases are created again, so the records that arrived before then and
// had not been handled are never delivered (a gap). A member that
// subscribes while the table is gone, or created again but still without
// leases, cannot tell it from a new group: it takes the leases at once,
// and a member that has not found out yet may read the same shards until
// its next renewal (failover_time / 3).
//
// Every member is a KCL worker with its own identifier (the host's name
// and a random suffix). Each failover_time / 2 it scans the table and
// takes leases balanced by count: its target is the number of live
// leases divided by the number of members, rounded up; it takes expired
// leases first, and when none is free it asks the most loaded member for
// one lease (at most one at a time, as the KCL steals). Asking is the
// KCL's graceful hand-off: leaseOwner becomes the asker and
// checkpointOwner the holder, who drains the lane, checkpoints and
// releases it; a holder that does not (it crashed) sees the lease expire.
// A member renews its leases every failover_time / 3 by incrementing the
// counter with a conditional write. A lease expires when its counter has
// not moved for failover_time, measured on the taker's own clock from
// when it first saw that counter: clocks of different hosts are never
// compared.
//
// The holder, in turn, stops using a lease before anyone may take it: at
// a deadline of its own, 3/4 of failover_time after the start of its
// last successful write of the lease (the take, a renewal, a
// checkpoint). The write may have landed any time after it began, and
// the taker's failover_time runs from when it saw the counter move, so
// from after that start: the last quarter is room for a handler already
// running to finish and for clocks that run at slightly different rates.
// From the deadline on nothing more of the shard is delivered, no
// checkpoint is written, the lease is no longer renewed (a late renewal
// that lands does not bring it back), and the lane is lost (Lanes.Lost)
// at once, from a watchdog of the member's own; a lane draining in
// Revoked then has its drain cut short. A failed renewal is tried again
// at the next one: failures are not counted, the deadline alone decides.
// The leases are renewed in parallel. So when a member's renewals fail
// or stall (DynamoDB slow, a network cut), it has stopped handing the
// shard's records on before another member takes the lease: a record
// is handled by both only when a handler already running outlives the
// last quarter. Ownership rests on timing
// all the same: a member frozen past its deadline (a long pause, a
// suspended VM) stops when it wakes, but a handler it was running then
// finishes, maybe while the next holder handles the same records.
//
// Every call ends within request_timeout, whatever its context: a
// Publish whose PutRecords is cut short fails as of unknown outcome and
// omnibus publishes its records again (a record may then be stored
// twice). Every call a member makes has a tighter bound:
// a write of a lease (a take, a renewal, a checkpoint, a release) and
// the read that checks a refused one by failover_time / 4, every other
// call (a page of the lease table's scan or of the shards' listing, the
// table's creation, GetRecords) by failover_time / 2. A call on a
// connection that stopped answering (a server that hangs, a network
// path lost under an open connection) is cut short and made again on a
// new one, so no member waits on one for ever: its taker looks at the
// table again at its next round, its readers read on, and Close returns
// within failover_time / 4 once a revocation in progress is done
// (failover_time more to delete an ephemeral group's table; a lease it
// could not release expires). A lease given up at its deadline is not
// released: a member that reaches DynamoDB again takes its own leases
// back at its next look at the table (failover_time / 2), and another
// member takes them once they expire, not sooner, which keeps the last
// quarter for a handler still running.
//
// Checkpoints are conditional on the owner and the counter, so a member
// that lost its lease can never move its checkpoint: the write fails
// with ErrNotOwner (as does one begun past the lease's deadline). One
// begun before the deadline may land after it, which is safe: only this
// member's writes moved the counter since, so no one else read the shard
// under a lease of their own yet, what it records was handed out before
// the deadline and handled, and it moves the counter, so the lease is
// taken only failover_time after that. The engine's Lanes callbacks
// follow the leases: Claimed when the member takes a lease; Revoked (the
// engine drains the lane and checkpoints, then the lease is released)
// when another member asks for it, when its shard ended, and on Close;
// Lost when another member took it or it passed its deadline.
//
// # Resharding
//
// A shard that is split or merged is read to its end and checkpointed as
// SHARD_END before any of its children is handed to anyone: a child's
// lease is taken only when every parent's lease says SHARD_END (or the
// parent has no lease: the group never read it). That is what keeps each
// key's order across a split and a merge. The member that ends a shard
// lists the shards at once and creates the children's leases (from
// TRIM_HORIZON); other new shards appear at the next shard sync, without
// a restart. A finished lease is deleted as the KCL's lease cleanup
// deletes it: once every child shard has a lease checkpointed past its
// start and the finished shard's own parents have no lease left (parents
// go first), or once the shard is gone from the stream and every child
// listed has a lease. A child whose parent has no lease counts it as
// read, and a shard sync never leases again a shard whose descendant is
// leased, so the barrier holds after the cleanup.
//
// # Delivery semantics
//
// Publish sends PutRecords calls of up to 500 records and 5 MiB. What
// Kinesis did not store is sent again, with backoff, until it lands or
// the context ends: records PutRecords answers as failed
// (ProvisionedThroughputExceededException, InternalFailure: Kinesis
// documents them as not added), each on its own, and a call throttled or
// that found no connection; what still fails comes back as that
// message's error, and a message whose record would be over 1 MiB fails
// alone with ErrTooLarge. A record sent again may land after a later
// record of its key, as with Kinesis's own PutRecords retries.
//
// Kinesis keeps no message IDs, so it cannot drop a record sent twice.
// A call whose outcome is unknown is therefore never sent again inside
// the driver: no answer came (the connection broke or the context ended
// with the call sent), or Kinesis failed on its side (a 500 or 503:
// InternalFailure, ServiceUnavailable), which may come after it stored
// the records. The call's messages fail marked driver.ErrOutcomeUnknown,
// and those of the publish's later calls are not sent (they would land
// ahead of them) and fail marked driver.ErrRetryable. omnibus's Publish
// (and a Publisher) then publishes them again with the same IDs, which
// its log (a warning) and PublishRetryHook show: a message whose first
// try had landed is then in the stream twice, its copy behind what was
// published since, and is delivered twice. Receivers that must not see it
// twice deduplicate by ID.
//
// A subscription is a member of the group; each shard leased is a lane
// named by its shard ID, and a delivery's Position is its sequence
// number. One goroutine per shard polls GetRecords (max_records per call)
// from the checkpoint, reading on at once while there is more and
// waiting poll_interval when caught up, and holds at most 10,000 records
// or 16 MiB ahead of the engine; an expired iterator is asked for again
// after the last record read; a throttled read backs off (200ms doubling
// to 10s); a GetRecords that does not answer within failover_time / 2
// is made again for half as many records (twice as many again after
// each answer within a quarter of that). Kinesis cannot nack: retries
// run in the engine and dead letters are published to the dead-letter
// stream. Checkpoints are the
// engine's watermark, written at most every CommitInterval. A new group
// starts at the time it is created (StartLatest: an AT_TIMESTAMP
// checkpoint) or at TRIM_HORIZON (StartEarliest). Delivery is at least
// once: a lease that moves without a checkpoint (a member crashed) is
// read again from the last one. A lease table deleted under the members
// loses the checkpoints: they read on from where a new group starts
// (see Leases and checkpoints), with StartLatest skipping records. Enhanced fan-out (SubscribeToShard) is
// not used.
//
// Lag is time: for every shard not read to its end, the milliseconds the
// first record after the group's checkpoint has waited since it arrived
// (at least the MillisBehindLatest Kinesis reports for it), 0 when no
// record follows the checkpoint; a shard that cannot be read is unknown,
// never zero. It is read from outside the group (the lease table and one
// GetRecords per shard, which counts against the shard's read limit), so
// members, the autoscaler and `omnibus lag` see the same number. The
// same time is the lane's age (Capabilities.Age, LaneLag.Age). There is
// no lag in records: Kinesis has no offsets and sequence numbers grow by
// unrelated steps, so counting the records between a checkpoint and the
// shard's end means reading them all, at the shard's read limit (5
// GetRecords a second, 2 MB/s, shared with the members) — too dear for a
// lag read. Tools that need a count (the dlq package's Count) say they
// cannot tell on Kinesis.
//
//	capability       kinesisbus
//	ordered lanes    yes (shards)
//	lag              millis (and age); no count of records
//	exclusive lanes  yes (a shard is read by one member of a group)
//	groups           yes
//	replay           yes (TRIM_HORIZON)
//	native nack      no (the engine retries)
//	max message      max_message_bytes, by default 783,360 bytes: a
//	                 binary body in base64 within Kinesis's 1 MiB
//	                 (Publish refuses records over 1 MiB per message)
//
// # Errors
//
// Errors name the operation and the stream and wrap driver sentinels:
// ErrNotFound (no such stream, a group without a lease table), ErrTooLarge,
// ErrInvalid (a bad URL, a lease table of the wrong shape, no permission),
// ErrClosed, ErrRetryable where Kinesis or DynamoDB refused before acting
// (throttling, no connection), and ErrOutcomeUnknown where a write may or
// may not have taken effect (a failure on the server's side, any answer
// of the 500s; a publish that got no answer). The SDK's error
// (a smithy.APIError) stays reachable with errors.As. ErrNotOwner marks a
// lease write refused because the member no longer holds the lease.
//
// # Concurrency
//
// Everything is safe for concurrent use. A connection holds one Kinesis
// and one DynamoDB client; each member runs a taker, a renewer (with a
// goroutine per lease while it renews them), a watchdog of the leases'
// deadlines and a reader per shard it holds, all ended by Close.
package kinesisbus

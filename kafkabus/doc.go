// Package kafkabus is omnibus's Apache Kafka transport, schemes kafka://
// and kafkas:// (TLS), built on franz-go (kgo and kadm).
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/kafkabus"
//
//	c, err := omnibus.Open(ctx, "kafka://broker1:9092,broker2:9092?client_id=billing")
//
// # URL
//
//	kafka://[user[:password]@]host[:port][,host[:port]...][?param=value&...]
//	kafkas://...   same, with TLS
//
// The hosts are seed brokers (port 9092 when omitted). A user name turns
// on SASL with the mechanism parameter; the password never appears in an
// error (URLs are redacted). Unknown parameters are an error.
//
// The portable layer reads durability (none | leader | all, default all)
// for every transport: it maps to Kafka's acks 0, 1 and all (-1), chosen
// per Publish. At all the producer is idempotent (enable.idempotence,
// which Kafka allows only with acks=all); none and leader produce without
// idempotence. There is no acks parameter.
//
//	parameter                  default              Kafka's name / meaning
//	client_id                  omnibus              client.id
//	tls                        false (kafkas: true) security.protocol SSL / SASL_SSL
//	tls_ca                     system roots         ssl.truststore.location: PEM file of CAs
//	tls_cert, tls_key          (none)               ssl.keystore.location: PEM files of a client
//	                                                certificate and its key, for brokers that
//	                                                authenticate clients by certificate
//	tls_server_name            the broker host      TLS server name to verify
//	mechanism                  PLAIN                sasl.mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
//	create_topics              dlq                  which topics Publish and Subscribe create on first use:
//	                                                none, dlq (dead-letter topics), all
//	                                                (the client-side auto.create.topics.enable)
//	partitions                 -1 (broker default)  num.partitions of topics created on first use
//	replication_factor         -1 (broker default)  default.replication.factor of created topics
//	compression                none                 compression.type: none, gzip, snappy, lz4, zstd
//	linger                     0                    linger.ms, as a Go duration (5ms)
//	max_message_bytes          1048588              message.max.bytes / max.message.bytes: the
//	                                                largest record batch produced; Capabilities
//	                                                reports it, less 512 bytes of record
//	                                                overhead, as MaxMessageBytes
//	max_buffered_records       10000                records buffered by a producer (buffer.memory, in records)
//	idempotent                 true                 enable.idempotence (durability all only)
//	delivery_timeout           2m                   delivery.timeout.ms
//	request_timeout            30s                  request.timeout.ms, and the retry bound of
//	                                                metadata and admin requests
//	session_timeout            45s                  session.timeout.ms
//	heartbeat_interval         3s                   heartbeat.interval.ms
//	rebalance_timeout          1m                   rebalance.timeout.ms (max.poll.interval.ms)
//	fetch_max_wait             500ms                fetch.max.wait.ms
//	fetch_max_bytes            52428800             fetch.max.bytes
//	fetch_max_partition_bytes  1048576              max.partition.fetch.bytes
//	metadata_max_age           5m                   metadata.max.age.ms: how soon new partitions are seen
//	dial_timeout               10s                  socket.connection.setup.timeout.ms
//
// The tls_* parameters need TLS (kafkas://, or tls=true); on a URL
// without it they are an error rather than ignored.
//
// Open checks that a seed broker answers, bounded by its context, so an
// unreachable cluster, a certificate that does not verify (wrong CA,
// wrong server name) or credentials the brokers refuse are an error at
// Open rather than at the first publish. A broker that closes the
// connection during SASL authentication (as some do instead of
// answering SASL_AUTHENTICATION_FAILED) is reported as the failed
// authentication it is.
//
// # Configuration in Go
//
// What a URL cannot carry goes in through [New], whose Driver is handed
// to omnibus.Open with omnibus.WithDriver: a *tls.Config ([WithTLS]) and
// franz-go's own options ([WithClientOpts]: a SASL mechanism such as
// OAUTHBEARER or AWS_MSK_IAM, a dialer, hooks). The URL still names the
// brokers and sets every parameter.
//
// # Topics
//
// A topic that does not exist is an error wrapping ErrNotFound from
// Publish and Subscribe, unless create_topics covers it. Dead-letter
// topics (where the engine dead-letters, by default "<topic>.dlq", and
// any name ending in ".dlq") are created on first use by default, because
// omnibus, not the user, owns them.
// [omnibus.Client.CreateTopic] makes sure a topic has at least N
// partitions, creating it or adding partitions; members of the same
// client notice added partitions at once, others at their next metadata
// refresh (metadata_max_age).
//
// For tools, the connection (omnibus.Client.Driver) also has
// TopicExists, DeleteTopic (the topic, with its records) and DeleteGroup
// (the group's committed offsets on the topic: the whole group when it
// has none on another topic, else its offsets on that topic alone); a
// topic or group that does not exist is no error. The CLI's bench
// removes what it made with them.
//
// # Messages on the wire
//
// A message is one record in CloudEvents binary content mode, as the
// CloudEvents Kafka protocol binding spells it, so the CloudEvents SDKs
// and any other client read it (tested with the Go SDK's sarama binding,
// both ways):
//
//	field        record
//	ID           header ce_id
//	Key          record key, and header ce_partitionkey
//	Type         header ce_type
//	Source       header ce_source
//	Time         header ce_time (RFC 3339 with nanoseconds)
//	ContentType  header content-type
//	Body         value
//	             header ce_specversion: 1.0
//	Headers      header ce_<name> for a name of lowercase letters and
//	             digits ("tenant": ce_tenant, a CloudEvents extension),
//	             header <name> for any other ("trace-id")
//
// On receipt every ce_* header that is no field above (an extension of
// any producer, ce_subject) is delivered as the header of its name without
// the prefix ("tenant"), and other headers as they are; names are read in
// any case, as the binding's readers do. The record key is the Key; a
// record without one takes ce_partitionkey. The record timestamp is the
// publish time, as with the Java producer, so retention counts from when a
// message was written: a dead letter of an old message is not expired at
// once. A record without ce_id (from another client) gets the ID
// "<topic>/<partition>/<offset>", which stays the same on redelivery; one
// without ce_time gets the record timestamp as its Time. A record whose
// content-type is application/cloudevents+json is in structured content
// mode: its fields come from the JSON event in the value (the SDK sends
// so when asked for structured mode).
//
// Keys pick partitions with Kafka's default partitioner (murmur2 of the
// key, as the Java client), so omnibus and Java producers put a key on
// the same partition; records without a key are spread in sticky batches.
//
// # Delivery semantics
//
// Publish produces the batch at once and waits for every record's
// acknowledgement at the durability asked for; records that fail are
// reported one by one (a record over max_message_bytes fails with
// ErrTooLarge while the others land). Records of one key keep their order.
//
// franz-go retries a produce inside the client until delivery_timeout
// (a leader moving, a broker restarting); with durability all the
// producer is idempotent, so those retries store a record once. A record
// franz-go gives up on (its delivery timeout, its retries), or whose
// connection drops with the request on it, fails marked
// driver.ErrOutcomeUnknown; one that never reached a broker (no
// connection, not the leader, not enough replicas) driver.ErrRetryable.
// omnibus.Publish produces those again with the same IDs until its
// context ends; a record produced again is a new record to Kafka, so one
// that had landed is stored twice (the same ID in ce_id).
//
// An omnibus.Publisher queues its batches into franz-go's producer
// (driver.Queuer) without waiting for each, as Produce with a promise is
// used: the producer keeps a key's records in order across batches and
// its own retries, and what it gives up on fails without being produced
// again (a second try would land behind the records produced since).
// franz-go times a record out only between requests: a broker that
// takes a produce request and never answers holds its records for
// request_timeout and franz-go's overhead of 10 s, whatever
// delivery_timeout says. A record whose context ends first (the
// Publisher's Close, its PublishTimeout) fails at once, marked
// driver.ErrOutcomeUnknown: franz-go does not say whether it was in a
// request already.
//
// A subscription is a member of a Kafka consumer group (group.id is the
// omnibus group) using the cooperative-sticky balancer; each assigned
// partition is a lane named by its number ("0", "1", ...), and a
// delivery's Position is its offset. Kafka cannot nack: retries run in the
// engine and dead letters are published to the dead-letter topic.
// Commits are the engine's watermark: the offset after the highest
// settled record of a lane, committed synchronously. When the group takes
// a partition away, kafkabus stops fetching it, the engine drains it and
// commits from inside the revocation, and only then does the group move
// it; commits for partitions the member no longer holds are never sent.
// Lost partitions (an expired session) are abandoned without a commit.
// A group omnibus named itself (no Group option) is deleted from Kafka
// when its last member leaves.
// Delivery is at least once. Kafka counts no deliveries: the commit
// metadata at a partition's committed offset counts the members that
// began its record without settling it (driver.AttemptKeeper), and
// names the last one, so that a member that lost the partition and
// claimed it again is counted once.
//
// A new group starts at the end of each partition (StartLatest) or at the
// log start (StartEarliest). With StartLatest the member commits that end
// offset when it first claims a partition the group has no commit for,
// so a crash before the first commit does not skip messages; a partition
// added to the topic after the group started is read from its beginning.
//
// Below the engine's bounds (MaxInFlight, MaxInFlightBytes), franz-go
// buffers what it fetched and Receive has not returned yet: at most one
// fetch per broker in flight, each of at most fetch_max_bytes and the
// subscription's MaxInFlightBytes, whichever is smaller (and
// fetch_max_partition_bytes per partition), as Kafka returns at least one
// record batch even when it is larger. Records polled that do not fit in
// the engine's room wait, first in line, for the next Receive.
//
// Lag is, for every partition of the topic, the high watermark minus the
// group's committed offset, or minus the log start offset where the group
// has no commit; a partition whose offsets cannot be read is unknown,
// never zero. Its age is the timestamp of the record at that offset:
// the time the record was produced (kafkabus leaves the record timestamp
// to the producing client's clock and carries Message.Time in ce_time),
// or appended, on a topic with LogAppendTime. Reading it costs one Fetch
// of the record batch holding the offset, per partition with lag and per
// committed offset (a lane that does not move costs none). The group's
// members are those DescribeGroups lists, from every process.
//
//	capability       kafkabus
//	ordered lanes    yes (partitions)
//	lag              records, and age
//	exclusive lanes  yes (a partition is read by one member of a group)
//	groups           yes
//	replay           yes
//	native nack      no (the engine retries)
//	max message      max_message_bytes less 512 (1048076)
//
// # Errors
//
// Errors name the operation and topic and wrap driver sentinels:
// ErrNotFound (unknown topic), ErrTooLarge (record over the limit),
// ErrClosed, ErrInvalid (bad URL), and ErrRetryable only where the broker
// cannot have acted (no connection, not the leader, not enough replicas).
// The franz-go error (a *kerr.Error, a net error) stays reachable with
// errors.As.
//
// # Concurrency
//
// Everything is safe for concurrent use. A connection holds one admin
// client, one producer client per durability level used (created on first
// use) and one consumer client per subscription.
package kafkabus

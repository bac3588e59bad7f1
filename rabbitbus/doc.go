// Package rabbitbus is omnibus's RabbitMQ transport, schemes amqp:// and
// amqps://, built on github.com/rabbitmq/amqp091-go and tested against
// RabbitMQ 3.10.
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/rabbitbus"
//
//	c, err := omnibus.Open(ctx, "amqp://guest:guest@localhost:5672/?partitions=8")
//
// # URL
//
//	amqp://user:password@host[:port][/vhost][?param=value&...]
//	amqps://user:password@host[:port][/vhost][?param=value&...]
//
// The port defaults to 5672 (amqp) or 5671 (amqps); an empty path is the
// virtual host "/", which is also written %2F. The host is required: a
// URL without one (amqp:/host, amqp:user:pass@host, amqp:///vhost) is an
// error, never a connection to localhost as guest. Unknown parameters are
// an error. Errors never show the password, nor a user name given
// without one (it may be a token); a "/" in a password is written %2F.
// Open dials, so a certificate that does not verify (wrong CA, wrong
// server name) fails it at once, and credentials the server refuses
// fail it with "authentication failed" after the 3 seconds RabbitMQ
// waits before it answers a failed login.
//
//	parameter          default     meaning
//	durability         all         none | leader | all, read by package omnibus (below)
//	queue_type         classic     classic | quorum: the type of every queue omnibus declares
//	partitions         (unset)     N: partitioned mode with N ordered lanes per group (1..1024)
//	mandatory          false       true: a message no queue takes fails with ErrUnroutable
//	max_message_bytes  134217728   largest body accepted; set it to the server's max_message_size
//	heartbeat          10s         AMQP heartbeat interval
//	connect_timeout    30s         bound on TCP connect and AMQP handshake
//	rebalance          2s          partitioned mode: how often a member checks its share of lanes
//	tls_ca             (system)    amqps: PEM file of the CAs to trust
//	tls_cert, tls_key  (none)      amqps: PEM files of a client certificate and its key
//	tls_server_name    (host)      amqps: name to verify the server's certificate against
//	tls_insecure       false       amqps: skip verifying the server's certificate (tests only)
//
// # Configuration in Go
//
// What a URL cannot carry goes in through [New], whose Driver is handed
// to omnibus.Open with omnibus.WithDriver: a *tls.Config ([WithTLS]) and
// amqp091-go's configuration ([WithConfig]: SASL mechanisms such as
// EXTERNAL for a login by client certificate, a dialer, client
// properties). The URL still names the server and sets every
// parameter.
//
// # Topology
//
// omnibus declares everything it uses, and declares it again after a
// reconnection:
//
//   - A topic is a durable topic exchange named after it.
//   - A consumer group is a durable queue "<topic>:<group>" bound to the
//     exchange with "#": every group gets every message; the members of a
//     group are competing consumers of its queue. The queues of a group
//     the user did not name (a throwaway group) expire EphemeralExpiry
//     after their last consumer leaves (x-expires).
//   - Retries (see Nack below) go through durable queues
//     "<topic>:<group>:retry:<ms>ms" with that message TTL, which
//     dead-letter back into the group's queue. With queue_type=quorum
//     they are declared with x-dead-letter-strategy at-least-once and
//     x-overflow reject-publish (see Delivery semantics). A throwaway
//     group's retry queues expire EphemeralExpiry after their TTL once
//     unused (declaring counts as use, publishing does not: a member
//     declares a retry queue again at least every EphemeralExpiry/2 while
//     it retries through it, so the queue outlives what it holds). A
//     retry queue declared earlier with other arguments fails its
//     declaration (ErrInvalid); the engine then retries in place until
//     the queue is deleted.
//   - A dead-letter topic (where the engine dead-letters, by default
//     "<topic>.dlq", and any name ending in ".dlq") also gets a durable
//     queue of the same name
//     bound with "#", so dead letters are kept even when nobody consumes
//     them. The group named after the dead-letter topic itself reads
//     that queue (unpartitioned, whatever the URL's partitions): it is
//     the group of the dead-letter tools (package dlq, omnibus dlq); any
//     other group of a ".dlq" topic gets what arrives after it exists.
//   - Partitioned mode (partitions=N): each group gets a durable
//     consistent-hash exchange "<topic>:<group>" bound to the topic's
//     exchange, feeding N durable queues "<topic>:<group>:<n>" declared
//     with x-single-active-consumer. The plugin must be enabled on the
//     server: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange.
//     Open fails with ErrUnsupported when it is not. A named group also
//     gets a durable stream queue "<topic>:<group>:runs" (x-queue-type
//     stream) of run records (see Consuming), kept a day (x-max-age 1D,
//     1 MiB segments, at most 64 MiB); a throwaway group has none.
//
// A new group starts with the messages published after it was created:
// RabbitMQ keeps no history for a queue that did not exist (no replay).
// Messages published to a topic with no group are dropped by the server,
// or reported with mandatory=true. Nothing omnibus declares is deleted by
// omnibus unless asked: for tools, the connection (omnibus.Client.Driver)
// has TopicExists, DeleteTopic (the topic's exchange, and a dead-letter
// topic's queue) and DeleteGroup (the group's queue or partition queues,
// its stream of run records, its consistent-hash exchange and its retry
// queues, with the messages they hold); a topic or group that does not
// exist is no error. The
// CLI's bench removes what it made with them.
//
// # Messages on the wire
//
// AMQP 0-9-1, which RabbitMQ speaks, has no CloudEvents protocol binding.
// rabbitbus follows the AMQP (1.0) protocol binding, binary content mode,
// mapped onto the same-named 0-9-1 fields: attributes are application
// properties (0-9-1 headers) named cloudEvents:<attribute>, the content
// type is the content-type property. The CloudEvents SDKs' AMQP bindings
// speak AMQP 1.0, which RabbitMQ does not by default, so the mapping is
// tested against the binding's written rules with a raw 0-9-1 client.
//
//	field        AMQP 0-9-1 message
//	ID           application property cloudEvents:id, property message-id
//	Key          routing key, application property cloudEvents:partitionkey
//	Type         application property cloudEvents:type, property type
//	Source       application property cloudEvents:source, property app-id
//	Time         application property cloudEvents:time (RFC 3339 with
//	             nanoseconds), property timestamp (seconds)
//	ContentType  property content-type
//	Body         body
//	             application property cloudEvents:specversion: 1.0
//	Headers      application property cloudEvents:<name> for a name of
//	             lowercase letters and digits ("tenant":
//	             cloudEvents:tenant, a CloudEvents extension), application
//	             property <name> for any other ("trace-id")
//
// On receipt the cloudEvents: attributes win over the properties, and the
// cloudEvents_ spelling (which JMS clients need, ':' being no identifier
// character there) is read too, in any case. Every attribute that is no
// field above (an extension of any producer, cloudEvents:subject) is
// delivered as the header of its name without the prefix ("tenant"); a
// native AMQP timestamp in cloudEvents:time is read as well as the
// string. A message whose content-type is application/cloudevents+json
// is in structured content mode: its fields come from the JSON event in
// the body. A keyless message is routed by its ID and marked
// omnibus-keyless, so partitioned topics spread keyless messages;
// delivery-mode is 2 (persistent) unless durability is none. Received x-*
// headers (x-death, x-delivery-count) and non-scalar application
// properties are not copied into Headers; so that every header a client
// publishes arrives, Publish refuses (ErrInvalid) header names with the
// x- prefix, RabbitMQ's, and rabbitbus's own omnibus-attempt,
// omnibus-key and omnibus-keyless.
//
// # Delivery semantics
//
// Publishing: durability none sends transient messages without publisher
// confirms (at most once). leader and all (the same on RabbitMQ) send
// persistent messages on a channel in confirm mode and return when every
// message of the batch is confirmed; confirms are pipelined, so
// concurrent Publish calls and the messages of one batch share the
// connection without a round trip each. A message the server nacks fails
// with ErrNacked, an unroutable one (mandatory=true) with ErrUnroutable
// and driver.ErrNotFound, one over max_message_bytes with
// driver.ErrTooLarge, each in a *driver.MessageErrors entry of its own. If
// the server closes the channel because a body is over its own
// max_message_size, that message fails with ErrTooLarge and the others
// unconfirmed fail as of unknown outcome (see Reconnection), which
// omnibus.Publish sends again.
//
// During a memory or disk alarm the server blocks the connections that
// publish (connection.blocked) and stops reading from them. Publish then
// waits, and returns its context's error (naming the alarm) when the
// context ends; so do the declarations, dead letters, retries and
// Client.Lag, which use the same connection. A write already under way
// when the block comes goes on in the background and the rest of its
// batch is not sent: a Publish that returned an error may still have
// stored some of its messages, as they were given (it writes copies of
// the bodies, so the caller may reuse its messages at once). Close drops
// a blocked connection at once (a healthy one gets up to a second to
// answer connection.close).
// Consuming and acknowledging use the other connection, which the server
// does not block.
//
// Consuming (default mode): at least once, manual acknowledgements, the
// prefetch count is the engine's MaxInFlight. Delivery.Position is the
// AMQP delivery tag (per channel, informational). Acknowledgements of a
// contiguous run of deliveries go out as one multiple ack. The group's queue is one
// unordered lane, "0" (Capabilities.Ordered is false). The subscriber
// implements driver.Nacker: a nack republishes the message (confirmed,
// mandatory) to the retry queue for its delay, rounded to the nearest
// power of √2 milliseconds (10ms to 24h), then acknowledges the
// original; the server needs no delayed-message plugin. A republish the
// server returns (the retry queue was deleted) is sent again after
// declaring the queue again; if that fails too, the original is not
// acknowledged and the engine retries it in place. When the TTL runs
// out, a quorum retry queue dead-letters at least once: it keeps the
// message until the group's queue has confirmed it, and tries again
// (after a few minutes) while the group's queue is unavailable, full or
// gone. That strategy needs x-overflow reject-publish on the retry
// queue, which has no length limit and so never rejects a retry; the
// group's queue, the target, needs nothing: if a policy gives it a
// length limit with reject-publish, retries wait in the retry queue
// until there is room, and with the default drop-head it drops its
// oldest messages to take them. Classic queues dead-letter at most once:
// a retry is lost if the group's queue is gone when its TTL runs out, or
// if the server fails while dead-lettering it; use queue_type=quorum
// where that matters. Delivery.Attempt counts across
// retries through the omnibus-attempt header; a redelivery after a lost
// channel adds the queue's count: x-delivery-count on quorum queues, and
// on classic queues one more when the redelivered flag is set (classic
// queues do not count further).
//
// Consuming (partitioned mode): a message's key picks one of the N
// partition queues of each group (the consistent-hash exchange hashes
// the routing key), so one key's messages stay in one queue, in order.
// Lanes are the partition numbers "0".."N-1" (Ordered and ExclusiveLanes are
// true). Every member consumes every partition queue, each on a channel
// of its own; single-active-consumer makes one member active per queue
// and the others wait in line. RabbitMQ 3.10 does not tell a consumer
// that it became active, so a member announces a lane as claimed on its
// first delivery from that queue: a member may be active on an idle
// queue without having claimed it, and the engine's Stats show only
// lanes with traffic. Every rebalance interval a member reads each
// queue's consumer count (the number of members) and, when it is active
// on more than ceil(N/members) lanes, hands the extra ones over: it
// revokes them (the engine finishes and acknowledges what it holds,
// while the member's other lanes go on delivering), closes their
// channels (the server requeues the rest in order and activates the next
// member in line) and consumes them again at the end of the line. The
// engine retries failures in place in this mode (there is no Nack), so
// per-key order holds across retries. Order can break
// when a channel or connection is lost while handlers are running: the
// next active member gets the unacknowledged messages again while the
// old handlers may still be finishing (their results are discarded).
// The key-to-partition mapping belongs to each group's exchange and can
// change if the exchange's bindings are recreated.
//
// Run counts (partitioned mode): a partition's x-delivery-count rises
// for every member whose channel closed holding the message, also for
// those that never ran it (a process that crashed on another partition's
// message held it), so it would dead-letter such a message with the one
// that crashed. A named group therefore counts the members that ran a
// redelivered message (driver.RunCounter): before it runs one, a member
// appends a record (lane and message ID, member) to the group's stream
// with a publisher confirm, and waits until it reads the record back, as
// every member reads the stream from its first record; the message's
// Attempt is then the members recorded for it, plus its first holder.
// The acknowledgement appends a record that drops the count. A message
// without an ID keeps x-delivery-count, and so does a throwaway group's
// (it needs no records: its members share one process, and its queues
// expire after it, so no other process takes over what a crashed one
// held), as does a group whose stream the server refuses (before RabbitMQ 3.9, or with
// the stream_queue feature flag off; Subscribe logs a warning). A count
// older than the stream's retention is forgotten, so a message unsettled
// for longer counts afresh.
//
// Prefetch and memory: the server pushes up to the prefetch count
// (MaxInFlight) of unacknowledged deliveries per channel, and the
// subscriber buffers those the engine has not taken yet; the engine's
// MaxInFlight and MaxInFlightBytes count only what it took. In default
// mode there is one channel, so the engine and the buffer hold at most
// MaxInFlight messages together. Bytes are not bounded by the server
// (RabbitMQ does not implement a prefetch size): what MaxInFlightBytes
// keeps out of the engine waits in the buffer, so a member holds up to
// MaxInFlight messages whatever their size, at most MaxInFlight x
// max_message_bytes, beyond MaxInFlightBytes. In partitioned mode each
// queue the member is active on has a channel and a prefetch of its own,
// 16 x MaxInFlight (the engine's bound on what it holds, retries waiting
// in place included: a smaller prefetch would let one retrying key stop
// the others of its lane): a member active on k lanes holds up to
// k x 16 x MaxInFlight messages, engine and buffer together.
// Closing a member (Close, or the end of Shutdown) closes its channels:
// the server requeues at once everything unacknowledged, what the engine
// held and what sat in the buffer, and other members get it.
//
// Lag is per lane, in messages: the ready count of the lane's queue, read
// with a passive queue.declare, plus the deliveries that this client's
// members hold unacknowledged on it. Unacknowledged deliveries held by
// other processes are not counted (RabbitMQ reports them only through the
// management plugin's HTTP API, which omnibus does not use), nor are
// messages waiting in retry queues. A queue that cannot be read gives
// Known false. Every lane of the group is reported, not only the member's.
// Client.Lag reads a group from outside it in the layout the server has:
// a client without partitions, or with another count, finds a group's
// partition queues (from 0, at least as many as its URL says, more while
// they exist) or its one queue, whichever its members made.
//
// A lane's age is the age of the oldest delivery this client's members
// hold on it, by the message's time (the publisher's clock: RabbitMQ 3.x
// stamps nothing on arrival), when that is the queue's oldest
// unacknowledged message: a queue hands out its head first, so it is
// when the client is the lane's single active consumer (partitioned
// mode) or the queue's only consumer. A queue with nothing ready, nothing
// held and no consumer of another client has a known age 0. Elsewhere
// the age is unknown, never 0: AMQP shows the head of a queue only to
// whoever takes it (a basic.get would take it from the active consumer
// and put it back behind newer messages), and RabbitMQ tells its
// timestamp (head_message_timestamp) only through the management
// plugin's HTTP API. A delayed retry waiting in a TTL queue is not
// counted until it is back in the lane's queue.
//
// # Reconnection
//
// A client uses two connections, one for publishing and one (opened by
// the first Subscribe) for consuming. When either drops, it reconnects
// with backoff (100ms doubling to 3s, jittered) until Close. Publish
// waits while the publishing channel is down, until its context ends or
// the channel is back. When the channel dies under a Publish, its
// messages fail marked for omnibus.Publish to send again (it does, with
// the same IDs, after a backoff, until its context ends):
//
//   - a message sent and not yet confirmed: driver.ErrOutcomeUnknown (the
//     server may have stored it);
//   - a message whose write failed on the dead socket, and those after
//     it: driver.ErrRetryable (a message cut short is dropped by the
//     server; the others were not written);
//   - a declaration cut off by the lost connection: driver.ErrRetryable
//     (nothing was published).
//
// Topology is declared again on the new connection before publishing and
// before consuming. RabbitMQ keeps no message IDs, so a message published
// again after an unknown outcome may be stored twice: consumers see the
// copy as a duplicate with the same ID.
// When a consuming channel dies, its lane is reported lost (the engine
// abandons the work in flight; acknowledgements of deliveries from the
// dead channel are dropped, never sent on the new one, and the server
// delivers those messages again), and consuming resumes on a new channel.
//
//	capability       rabbitbus                 rabbitbus?partitions=N
//	ordered lanes    no (one unordered lane)   yes (N partition queues, single active consumer)
//	lag              depth                     depth
//	age              held here, alone only     held here (the active consumer)
//	exclusive lanes  no                        yes
//	groups           yes                       yes
//	replay           no                        no
//	native nack      yes (retry queues)        no (the engine retries in place)
//	max message      max_message_bytes         max_message_bytes
//
// # Errors
//
// Open fails on bad credentials ("authentication failed for user ...")
// and on a missing or forbidden virtual host (wrapping driver.ErrNotFound),
// with the password redacted. Declaring over an existing queue with other
// settings (for example another queue_type) fails with driver.ErrInvalid.
// The amqp091-go error stays reachable with errors.As.
//
// # Concurrency
//
// Everything is safe for concurrent use. A subscriber's Receive is called
// from one goroutine; Ack, Nack and Lag may be called concurrently with it.
package rabbitbus

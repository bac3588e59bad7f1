// Package natsbus is omnibus's NATS JetStream transport, scheme nats://,
// on nats.go's jetstream package. It also runs an embedded NATS server
// inside the process (nats://embedded), omnibus's zero-setup default.
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/natsbus"
//
//	c, err := omnibus.Open(ctx, "nats://127.0.0.1:4222")
//	c, err := omnibus.Open(ctx, natsbus.DefaultURL) // nats://embedded
//
// # URL
//
//	nats://[user:password@ | token@]host[:port][,host[:port]...][?param=value&...]
//	nats://embedded[?dir=DIR&max_payload=N&...]
//
// User and password, or a token (user info without a password), come from
// the URL's user info; errors never show them (a "/" in a token is
// written %2F). The port defaults to 4222; the host is required:
// nats://embedded is the one URL that names no server, and a URL without
// a host (nats:/host, nats:host, nats://) is an error, never the local
// server. Several hosts, comma separated, are a cluster's seed list. TLS is the tls parameter (or any tls_* parameter);
// there is no tls:// scheme, because omnibus's schemes name transports.
//
// nats://embedded starts github.com/nats-io/nats-server/v2 in the process
// with JetStream file storage in dir, listening on 127.0.0.1 on a random
// port (see [Server.URL]; clients of the process connect in-process, not
// over TCP). Without dir the data lives in the per-user data directory
// ([DefaultDir]: $XDG_DATA_HOME/omnibus/nats, else
// ~/.local/share/omnibus/nats), so it outlives the process. Every client
// opened with the same dir shares one server, which stops when the last
// of them closes. A server locks its directory (omnibus.lock, which also
// holds its address): a process that opens a directory another process
// serves connects to that server over TCP, and when that process ends,
// its clients start the server themselves (one of them; the others follow
// it) with the same data, so no two servers ever share a directory. A dir
// that cannot be created or written is an error at Open. [StartServer]
// starts a server of its own (in a temporary directory by default) for
// callers that want one without a URL, and [EmbeddedURL] builds the URL
// for a directory.
//
// Parameters (the portable durability parameter is read by omnibus.Open:
// none publishes with core NATS and does not wait; leader and all wait
// for JetStream's publish ack, which on a replicated stream comes after
// the replicas' quorum):
//
//	parameter           default     NATS name            meaning
//	name                omnibus     Name                 connection name shown by the server
//	tls                 false       Secure               connect with TLS
//	tls_ca              -           RootCAs              CA file; implies tls
//	tls_cert, tls_key   -           ClientCert           client certificate and key; imply tls
//	tls_server_name     the host    tls.Config.ServerName  name to verify the server's certificate against; implies tls
//	creds               -           UserCredentials      credentials file (JWT and seed)
//	nkey                -           NkeyOptionFromSeed   file holding an nkey user's seed
//	connect_timeout     5s          Timeout              connection set-up, bounded by Open's ctx
//	reconnect_wait      500ms       ReconnectWait        pause between reconnect attempts
//	max_reconnects      -1          MaxReconnects        reconnect attempts, -1 forever
//	ack_wait            30s         AckWait              redelivery of an unacknowledged delivery
//	max_ack_pending     16 × MaxInFlight  MaxAckPending  unacknowledged deliveries of a group
//	publish_window      4096        PublishAsyncMaxPending  publishes awaiting their ack, per client
//	publish_timeout     30s         PublishAsyncTimeout  wait for one publish ack
//	replicas            1           Replicas             replicas of a stream created by natsbus
//	max_age             0 (keep)    MaxAge               age limit of a stream created by natsbus
//	dupe_window         2m          Duplicates           window in which a message ID is deduplicated
//	storage             file        Storage              file or memory, for created streams
//	inactive_threshold  0 (keep)    InactiveThreshold    delete a group's consumer after this idle time (throwaway groups: 5m)
//	dir                 DefaultDir  store_dir            embedded only: JetStream data directory
//	max_payload         8388608     max_payload          embedded only: largest message
//	partitions          0 (none)    -                    partitioned mode: partition subjects of a topic natsbus creates
//	lease_ttl           10s         bucket TTL (MaxAge)  partitioned: life of a partition lease not refreshed (>= 500ms)
//	rebalance_interval  1s          -                    partitioned: how often a member compares its share of partitions
//
// Unknown parameters are an error wrapping omnibus.ErrInvalid, and so
// are TLS and credential parameters on nats://embedded, which clients
// in the process reach without either. A server that refuses the
// credentials fails Open with an error naming what was offered (the
// user, the nkey or creds file), never the password or token.
//
// # Configuration in Go
//
// What a URL cannot carry goes in through [New], whose Driver is handed
// to omnibus.Open with omnibus.WithDriver: a *tls.Config ([WithTLS]),
// nats.go's own options ([WithOptions]: nats.UserJWT or nats.Nkey with
// a signer of your own, a custom dialer, handlers), or a connection of
// the caller's ([WithConn]), which natsbus uses and leaves open. The URL
// still sets every other parameter.
//
// # Topology
//
// A topic is a stream named after it (letters, digits, '-' and '_' kept;
// other characters become '_' followed by a hash of the topic) whose one
// subject is the topic itself, so other NATS clients publish to it by
// name; natsbus creates the stream on first use. A topic must be a valid
// NATS subject: no spaces or control characters, no wildcards '*' and
// '>', no empty tokens, no leading '$'; anything else is rejected with
// ErrInvalid naming the character. The dead-letter topic (by default
// "<topic>.dlq") is a topic like any other, with a stream of its own.
//
// A consumer group is a durable pull consumer of the stream, named after
// the group; every group receives every message, and the members of a
// group compete for the group's messages. A new group starts at new
// messages (the stream's next sequence), or at the first one the stream
// holds with StartEarliest.
//
// A group also records where each of its lanes resumes, in a KV bucket
// without TTL, "<stream>_positions_<group>_<hash>" (key "p.<lane>": the sequence
// after the consumer's ack floor, and the stream's creation time). Members
// write it when the group is created, every 5 seconds while they read,
// when they hand a lane over or leave, and before a reset (below); it only
// rises. A JetStream consumer keeps its position only while it exists;
// the record outlives it, so a group that exists never starts again at
// the end of the stream:
//
//   - a consumer missing when a member subscribes (deleted behind the
//     group's back, removed by inactive_threshold while the group was
//     stopped) is created again at the recorded position; without a
//     record (the bucket was deleted) at the stream's first message:
//     redeliveries, never a skip. Only a group with neither consumers nor
//     records is new. To start a group afresh, delete its consumers and
//     its positions bucket.
//   - a consumer deleted while members read it is created again the same
//     way by the first member whose pull fails (or whose pull's heartbeats
//     stop: a pull on a deleted consumer may get no answer at all, noticed
//     within 5 seconds); the engine logs a warning (the Receive error
//     "created again at the group's recorded position").
//   - a record lags the consumer by up to 5 seconds of acknowledgements:
//     after such a re-creation, an unpartitioned group gets those messages
//     again; a partition's reader drops its copies of what it already
//     settled (see Partitioned mode).
//
// A throwaway group (one the user did not name, SubscribeOptions.Ephemeral)
// leaves nothing behind: its last member deletes its consumers (and, when
// partitioned, its lease and positions buckets) when it closes, and the
// consumers carry InactiveThreshold (inactive_threshold, or 5 minutes) so
// the server removes them after a crash too. Nobody resumes a throwaway
// unpartitioned group, so it records no positions, and its consumer
// deleted behind its back ends the subscription with an error wrapping
// omnibus.ErrNotFound. A crashed partitioned member's buckets stay, the
// lease bucket empty once its keys expire.
//
// For tools, the connection (omnibus.Client.Driver) has TopicExists,
// DeleteTopic (the topic's stream, with its messages and consumers) and
// DeleteGroup (the group's consumers and its positions and lease
// buckets, which outlive the stream: delete a topic's groups before the
// topic); a topic or group that does not exist is no error. Running
// members create their consumers and buckets again (see DeleteGroup): a
// partitioned member whose lease bucket went creates it again, loses
// the lanes whose leases went with it and claims them again. The CLI's
// bench removes what it made with them.
//
// # Partitioned mode
//
// With partitions=N, a topic natsbus creates has N partition subjects,
// "<topic>.0" ... "<topic>.N-1", in its one stream; CreateTopic(topic, n)
// creates n (and grows an existing topic to n, which remaps keys, as on
// Kafka). A message goes to partition [Partition](key, N) (FNV-1a of the
// key modulo N); messages without a key go round-robin. Publishing or
// subscribing with a URL whose mode does not match an existing stream's
// layout is an error (ErrInvalid) that says which.
//
// Each partition is a lane ("0" ... "N-1"), ordered, and read by one
// member of a group at a time:
//
//   - the group has a durable pull consumer per partition,
//     "<group>_p<N>", filtered on the partition's subject; the first member
//     creates them all at the same start (the stream's next sequence, or
//     the first with StartEarliest), and each lane's position is recorded
//     as above;
//   - the members share the partitions through leases in a KV bucket per
//     stream and group ("<stream>_leases_<group>_<hash>", history 1, TTL =
//     lease_ttl): key "p.<N>" holds the owner's member ID, written with
//     Create (only when absent) and refreshed every lease_ttl/4 with
//     Update on the revision the owner wrote last (optimistic
//     concurrency); key "m.<member>" is each member's heartbeat. A key not
//     refreshed for lease_ttl expires on the server (MaxAge), so only the
//     server's clock decides expiry; members never compare clocks;
//   - every rebalance_interval a member counts the live members n (from
//     heartbeats and owners seen by a watcher on the bucket) and balances
//     by count, KCL-style: it takes free partitions up to ceil(N/n) (up
//     to floor(N/n) while another member has fewer than that), gives up
//     one partition at a time while it holds more than ceil(N/n), and,
//     when none is free and a member has fewer than floor(N/n), the most
//     loaded member (the lowest ID among equals) gives one up. Members
//     beyond N get no partition (exclusive lanes).
//
// Leases decide who owns a partition, on every server. On servers with
// pinned-client priority groups (nats-server 2.11 and later, which
// includes the embedded server), the partition consumers are also
// pinned-client consumers (priority group "omnibus", priority_timeout =
// lease_ttl), and a member that claims a partition unpins the consumer
// before it reads: from then on the server serves its pulls only, and a
// pull the previous owner left behind gets nothing (a pin mismatch).
// That fences the one case leases cannot: an owner frozen past its lease
// (a long GC pause, a suspended VM) whose pull request is still waiting
// on the server. On older servers (2.9, 2.10) such a pull can take a
// message; it comes back to the new owner after ack_wait, behind newer
// ones (late, never lost). Consumers made before pinning, or on an older
// server, are pinned when a member claims them on a server that has it.
//
// Handing a partition over, in order. A member gives a partition up by
// stopping its reads (a Receive in progress returns at once), calling
// Lanes.Revoked (the engine drains the lane within its drain bound and
// acknowledges what it finished), waiting up to two seconds until the
// server has applied those acknowledgements (they are asynchronous),
// recording the lane's position, and deleting its lease. What it leaves
// unacknowledged (deliveries abandoned at the drain bound, and messages
// its pull had prefetched but never handed to the engine) would, on a
// shared consumer, come back only after ack_wait, behind newer messages.
// So a member claiming a partition whose consumer has deliveries pending
// (num_ack_pending > 0) records the consumer's ack floor + 1 as the
// lane's position, deletes the consumer and creates it again there
// (DeliverByStartSequence) before reading: the first message not
// acknowledged comes first, and everything after it in order. Deleting
// the consumer also cuts off any pull the previous owner left on it; a
// create that fails leaves the consumer missing, and the next claim
// creates it at the recorded position. A member that cannot refresh a
// lease stops using it when three quarters of lease_ttl have passed since
// its last successful refresh began, before the server can expire it:
// from then on nothing of the lane is delivered, acknowledged or kept in
// progress, and the engine gets Lanes.Lost at that moment, from a
// watchdog of its own, even while another lane drains (a lane whose lease
// runs out during its own drain has the drain cut short instead); the
// next owner (maybe the same member) resets the consumer as above. A
// partition whose read fails otherwise (a pull whose heartbeats stop,
// say; a consumer deleted behind the group's back is created again, see
// above) is given up the same way at once, its lease deleted, and so is
// one whose reader finds that a delivery of its consumer never reached
// it (the server numbers deliveries; a pull the lane's previous owner
// left waiting on the server may have taken it; the member's own pull
// queues all it asks for, so the client never drops one as a slow
// consumer): what never arrived would come back only after
// ack_wait, behind newer messages, so the member claims the lane again
// and resets it. A crashed member's partitions
// move after lease_ttl. Nothing a member
// claimed outlives its Close: it deletes its leases, and any lease key
// still holding its ID (a claim whose reply Close cut off).
//
// A partition's reader is its consumer's only reader, so a message it
// pulls at or below the highest sequence it pulled before is a copy (the
// server redelivered it because its ack_wait ran out first, or its
// consumer was created again): a copy is never handed to the engine
// behind newer messages. While the original is held, the original takes
// over the copy's delivery; once settled, the copy is acknowledged again.
// A message nacked (OrderNone) comes back as a new delivery, and so does
// one the reader never pulled (taken by a stale pull on an older server).
//
// Limits, stated plainly:
//
//   - At least once. A reset redelivers, in order, messages above the ack
//     floor that were acknowledged out of order (OrderKey and OrderNone
//     complete out of order within a lane), and deliveries the previous
//     owner handled but could not acknowledge. A member that claims again
//     a lane it lost (its lease ran out, say on a starved machine, or a
//     pull failed) hands none of those it handled to its engine again:
//     it remembers, per lane, the messages it acknowledged while an
//     earlier one was unsettled, and those it handled once the lease had
//     run out (sequence and ID), and acknowledges their redeliveries
//     again; a lane it gave up to another member it forgets. (A handler
//     that returns after the engine was told the lane was lost is not
//     known to the member: its message comes again.) Another member claiming the lane handles them again. The
//     order check the tests apply is the honest one: a message may come
//     again, but never before an earlier one that was not handled yet.
//   - A reset starts the consumer afresh, and with it the server's
//     delivery counts, so a partitioned group keeps its own count of the
//     holders that began a lane's first unsettled message (key "b.<lane>"
//     of the positions bucket; driver.AttemptKeeper), a member that lost
//     the lane and claimed it again counted once. A message whose
//     handler crashes its process each time is dead-lettered after at
//     most MaxAttempts+2 processes: a crash is counted from the time the
//     message is its lane's first unsettled one, and a process may crash
//     on it before the acknowledgements of what it handled before it
//     reached the server. A handler that fails without crashing is
//     retried in the engine, which counts its attempts.
//   - Ownership rests on timing: a member frozen past its deadline (a
//     long GC pause, a suspended VM) stops delivering and acknowledging
//     when it wakes, but a handler already running finishes, possibly
//     while the next owner handles the same message again. On servers
//     before 2.11, a pull it left waiting can take a message (see above).
//   - A consumer created by something else with DeliverNew and never
//     acknowledged cannot be reset (its start is unknown); its pending
//     deliveries then come back after ack_wait, out of order.
//   - While a partition's consumer is being reset, GroupLag reports that
//     lane as unknown.
//   - A member balances the partitions the topic had when it joined:
//     after CreateTopic grows a topic, the new partitions are read once
//     members join (or rejoin) the group.
//   - In the ordered modes the engine retries in place and never Nacks,
//     so nothing of a lane comes back behind a retry; with OrderNone it
//     Nacks (NakWithDelay), and a nacked message comes back after newer
//     ones, as OrderNone allows.
//
// # Messages on the wire
//
// A message is a CloudEvent in binary content mode, as the CloudEvents
// NATS protocol binding spells it (tested with the Go SDK's JetStream
// binding, both ways, plain and partitioned):
//
//	field        NATS message
//	ID           header ce-id, and Nats-Msg-Id (the server's duplicate window drops a re-publish)
//	Key          header ce-partitionkey (and the partition subject, see above)
//	Type         header ce-type
//	Source       header ce-source
//	Time         header ce-time (RFC 3339 with nanoseconds)
//	ContentType  header ce-datacontenttype
//	Body         payload
//	             header ce-specversion: 1.0
//	Headers      header ce-<name> for a name of lowercase letters and
//	             digits ("tenant": ce-tenant, a CloudEvents extension),
//	             header <name> for any other ("trace-id")
//
// On receipt header names are read in any case (NATS header names are
// case-insensitive by design, though nats.go compares them exactly): the
// Ce-Id, Ce-Type, Ce-Partitionkey ... that omnibus wrote before it
// followed the binding decode as before. Every ce-* header that is no
// field above (an extension of any producer, ce-subject) is delivered as
// the header of its name without the prefix ("tenant"); a Content-Type
// header (another producer's) is the content type when ce-datacontenttype
// is missing; the server's Nats-* headers are not delivered, and a header
// named Nats-* is refused on publish (the server acts on them), as is a
// name NATS cannot carry (printable ASCII only, without
// "()/,:;<=>?@[\]{} and the double quote). Other headers are delivered
// as they are. Values (headers', and the fields' in ce-* headers) are
// written as they are, with CR and LF made spaces and the white space at
// either end dropped, as a NATS header carries them; they are not
// percent-encoded as the binding's current draft asks, because the
// CloudEvents SDK for Go does not decode that. A message without ce-id
// takes Nats-Msg-Id as its ID.
//
// A message in structured content mode (a Content-Type of
// application/cloudevents+json, or, as the binding's first version had
// every message, no header at all and a CloudEvent as the payload) is
// decoded from the JSON event in its payload; that is what the SDK's core
// NATS binding (protocol/nats) sends. That binding reads structured mode
// only, so it cannot read omnibus's messages, which are in binary mode;
// the SDK's JetStream binding reads both.
//
// # Delivery semantics
//
// At least once. Deliveries are acknowledged one by one (Ack, explicit
// ack policy); the engine's retries use NakWithDelay, so a failed message
// comes back after the backoff, possibly to another member.
// Delivery.Attempt is the server's delivery count (NumDelivered; a
// partition's is the group's own, see above) and
// Delivery.Position the stream sequence. The consumer's MaxDeliver is
// unlimited: the engine counts attempts and dead-letters after
// MaxAttempts by publishing to the dead-letter topic, then acknowledges.
// Ack returns once the server has read the acknowledgements (a flush),
// so what was settled before a suspect runs is not delivered again when
// the suspect crashes the process.
//
// The server's count also counts deliveries to members that never ran
// the message: what a crashed member held behind the poisoned message,
// and what the server pulled to a member that had died. Taken alone, it
// would dead-letter those with the poisoned one. So an unpartitioned
// group keeps its own count of the holders that ran a redelivered
// message (driver.RunCounter): when the engine is about to run a
// delivery whose count is above 1, the member records its run in the
// positions bucket (key "r.<sequence>") and the message's Attempt is the
// holders that ran it, its first holder counted as one; Ack deletes the
// record. A message whose handler crashes its process each time is
// dead-lettered once MaxAttempts processes ran it (by the next), and the
// others held beside it are not. A throwaway group keeps no positions,
// and its count is the server's.
//
// A message counts as held from the moment the reader takes it from its pull,
// wherever it then waits (the member's inbox, Receive's carry, the
// engine): every held message gets an in-progress signal every ack_wait/4
// to ack_wait/2, so neither a backlog nor a slow handler nor a retry
// waiting in the engine lets ack_wait run out. A partition's message is
// signalled for as long as the member holds it and its lease; an
// unpartitioned group's for up to 10 × ack_wait (at least 5 minutes),
// after which the server redelivers it to any member, so a handler that
// never returns does not keep its message for ever. Only what a pull
// buffers is not signalled (the server's clock runs from its
// delivery): should its ack_wait run out there, the copy the server
// redelivers is dropped on a partition (see Partitioned mode), and
// delivered again on an unpartitioned group (at least once).
//
// A member that leaves an unpartitioned group (Close, after the engine's
// drain in Shutdown) hands back at once, with Nak, everything it pulled
// and the engine did not settle: what the engine abandoned, what waits in
// its inbox and carry, and what its pulls still buffer; the group's
// other members get it now, not after ack_wait. A partitioned member
// releases its leases instead, and the next owner
// resets the consumer (see above). The member asks for nothing more and
// lets what it asked for arrive until it is all in or nothing came for
// 100 ms before it unsubscribes. One race is left: a pull response the server sends as
// the member unsubscribes is lost on the way, and the server, which
// counts it delivered, sends it again after ack_wait. A server before 2.11 can send a
// message handed back with Nak twice at once (the redelivery, and again
// as the stream's next); a member that gets a second delivery of a
// message it holds, or acknowledged among its last 256, does not handle
// it again (it acknowledges it again instead).
//
// Prefetch. Beyond the engine's MaxInFlight and MaxInFlightBytes, a
// member holds at most:
//
//   - per lane it reads (one unpartitioned; up to N partitioned), what its
//     pull buffers: the reader keeps MaxInFlight messages asked for and
//     not yet moved into the inbox, asking for more once half of them
//     were (pull requests on one subscription, so that the next travels
//     while the reader hands on the rest, and the lane's order holds),
//     each request for at most max(MaxInFlightBytes, max_payload + 4 KiB)
//     bytes (a request never asks for less than the largest message,
//     which would stall it);
//   - its inbox, between the pumps and Receive: 64 messages;
//   - Receive's carry, taken from the inbox and not fitting the engine's
//     room yet: fewer than MaxInFlight messages.
//
// So an unpartitioned member holds at most 2 × MaxInFlight + 64 messages
// besides the engine's, and a partitioned one (N+1) × MaxInFlight + 64
// when it reads N partitions.
//
// The connection reconnects forever by default, and consumers resume, so
// a server restart loses nothing. It has no reconnect buffer: a publish
// (or an ack) made while it is away fails at once, marked
// driver.ErrRetryable (nothing was sent), instead of being kept and sent
// on reconnect behind the caller's back. A publish ack lost with the
// connection (nats.go fails pending acks when it drops) or not received
// in time is marked driver.ErrOutcomeUnknown; no responders (a stream
// not back yet after a restart) and too many acks outstanding are marked
// driver.ErrRetryable; omnibus.Publish publishes those messages again
// with the same IDs, in the order given, until its context ends. Each
// message carries its ID as Nats-Msg-Id, so the stream drops a copy that
// arrives within its duplicate window (dupe_window, 2 minutes by
// default): a publish tried again within the window is stored once.
//
// Key order across a disconnect. Within one Publish call, once a message
// of a key fails in a way that is tried again, the later messages of that
// key in the call are not sent: they fail driver.ErrRetryable, and the
// ride-through publishes them after it, in order. Before sending on a
// connection other than the one its pending publishes went out on, a
// call waits for their outcome, so a message lost with the old
// connection holds back the rest of its key before any of it reaches the
// new one. Calls one after the other (a Publisher's batches of a key)
// are in order anyway. So the stream never stores a key's message after
// a later one of the same key from the same publisher (tested by
// restarting a server under concurrent publishes of several keys). One
// window is left: a reconnect that completes between the moment a call
// looks at the connection and the moment it sends (microseconds) lets a
// message go out on the new connection unchecked. Messages without a key
// have no order to keep.
//
// Publishing waits for JetStream's publish acks asynchronously, up to
// publish_window messages per client at once; a batch reports failures
// per message (a *driver.MessageErrors). The largest message is the server's
// max_payload less 1 KiB for headers (1 MiB on a default server, 8 MiB on
// the embedded one).
//
// Lag is num_pending + num_ack_pending of the group's consumer, per lane
// (LagDepth); a failed read reports Known false. Client.Lag (and the
// CLI's omnibus lag) read it without joining the group, with consumer
// info requests (driver.GroupLagReader); a missing stream or a group
// without consumers is ErrNotFound. A lane's age is the stream's time
// (the server's clock) of the first message on the lane's subject after
// the consumer's ack floor: every message up to the floor is
// acknowledged and that one is not. It costs one message get per lane
// with lag and per ack floor (a lane that does not move costs none).
//
//	capability       unpartitioned (default)             partitions=N
//	ordered lanes    no (one unordered lane, "0")        yes (lanes "0" ... "N-1", one member each)
//	native nack      yes (NakWithDelay)                  yes, used by OrderNone only
//	lag              depth (num_pending + num_ack_pending, per lane), and age
//	exclusive lanes  no                                  yes (at most N members get work)
//	groups           yes                                 yes
//	replay           yes (DeliverAll)                    yes (DeliverAll)
//	max message      server max_payload - 1 KiB          server max_payload - 1 KiB
//
// # Concurrency
//
// Everything is safe for concurrent use. Each client holds one NATS
// connection; each group member adds a pump goroutine per lane it reads
// (the lane's pull requests, and their messages into the member's
// inbox, a bounded queue that Receive empties in batches; the replies
// come through nats.go's goroutine of the pull's subscription) and a
// keeper goroutine (in-progress
// signals, and the group's positions). In partitioned mode a member also
// runs a watcher (the lease bucket's keys; it creates a deleted lease
// bucket again and watches the new one), a refresher (heartbeat and
// leases, written all at once), a balancer (claims and releases:
// Lanes.Claimed and Lanes.Revoked) and a watchdog (lease deadlines:
// Lanes.Lost). All end in the member's Close, which first releases the
// member's leases.
package natsbus

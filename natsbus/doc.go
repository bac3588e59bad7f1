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
// the URL's user info; errors never show them. The port defaults to 4222
// and the host to 127.0.0.1. Several hosts, comma separated, are a
// cluster's seed list. TLS is the tls parameter (or any tls_* parameter);
// there is no tls:// scheme, because omnibus's schemes name transports.
//
// nats://embedded starts github.com/nats-io/nats-server/v2 in the process
// with JetStream file storage in dir, listening on 127.0.0.1 on a random
// port (see [Server.URL]; clients of the process connect in-process, not
// over TCP). Every client opened with the same dir shares one server,
// which stops when the last of them closes; without dir the server stores
// in a temporary directory, removed then. A dir that cannot be created or
// written is an error at Open. [StartServer] starts a server of its own
// for callers that want one without a URL, and [EmbeddedURL] builds the
// URL for a directory.
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
//	creds               -           UserCredentials      credentials file (JWT and seed)
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
//	inactive_threshold  0 (keep)    InactiveThreshold    delete a group's consumer after this idle time
//	dir                 temporary   store_dir            embedded only: JetStream data directory
//	max_payload         8388608     max_payload          embedded only: largest message
//	partitions          -           -                    reserved for the partitioned mode (not implemented: ErrUnsupported)
//
// Unknown parameters are an error wrapping omnibus.ErrInvalid.
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
// messages (DeliverNew), or at the first one the stream holds with
// StartEarliest (DeliverAll).
//
// # Messages on the wire
//
// CloudEvents binary content mode: the ID is both Nats-Msg-Id (so the
// server's duplicate window drops a re-publish) and Ce-Id; Type, Source
// and Time are Ce-Type, Ce-Source and Ce-Time (RFC 3339 with
// nanoseconds); Ce-Specversion is 1.0; the key is Ce-Partitionkey (the
// CloudEvents partitioning extension). User headers travel as NATS
// headers with their names as given; CR and LF in values become spaces.
//
// # Delivery semantics
//
// At least once. Deliveries are acknowledged one by one (Ack, explicit
// ack policy); the engine's retries use NakWithDelay, so a failed message
// comes back after the backoff, possibly to another member.
// Delivery.Attempt is the server's delivery count (NumDelivered) and
// Delivery.Position the stream sequence. The consumer's MaxDeliver is
// unlimited: the engine counts attempts and dead-letters after
// MaxAttempts by publishing to the dead-letter topic, then acknowledges.
// A delivery held longer than half of ack_wait (a slow handler, a retry
// waiting in the engine) gets an in-progress signal every quarter of
// ack_wait, for up to 10 × ack_wait (at least 5 minutes); after that the
// server redelivers it. Unacknowledged deliveries of a member that closes
// come back after ack_wait. Each member's pull iterator prefetches up to
// 2 × MaxInFlight messages ahead of the engine (PullMaxMessages), so
// ack_wait runs from the prefetch. Acknowledgements are written asynchronously;
// a lost one means a redelivery, never a loss.
//
// The connection reconnects forever by default; publishes and acks made
// while it is away are buffered (up to 64 MiB) and sent on reconnect, and
// consumers resume, so a server restart loses nothing (publishes that
// fail during it are safe to repeat with the same IDs).
//
// Publishing waits for JetStream's publish acks asynchronously, up to
// publish_window messages per client at once; a batch reports failures
// per message (a *driver.BatchError). The largest message is the server's
// max_payload less 1 KiB for headers (1 MiB on a default server, 8 MiB on
// the embedded one).
//
// Lag is num_pending + num_ack_pending of the group's consumer (LagDepth);
// a failed read reports Known false.
//
//	capability       natsbus
//	ordered lanes    no (one unordered lane, "0"; partitioned mode not yet implemented)
//	native nack      yes (NakWithDelay)
//	lag              depth (num_pending + num_ack_pending)
//	lane cap         no
//	groups           yes
//	replay           yes (DeliverAll)
//	max message      server max_payload - 1 KiB
//
// # Concurrency
//
// Everything is safe for concurrent use. Each client holds one NATS
// connection; each group member adds a pump goroutine (the pull
// iterator's messages to Receive) and a keeper goroutine (in-progress
// signals), both ended by the member's Close.
package natsbus

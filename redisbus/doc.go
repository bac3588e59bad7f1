// Package redisbus is omnibus's Redis Streams transport, scheme redis://,
// on github.com/redis/go-redis/v9. It needs Redis 7.0 or later (XAUTOCLAIM,
// and the lag XINFO GROUPS reports).
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/redisbus"
//
//	c, err := omnibus.Open(ctx, "redis://127.0.0.1:6379")
//
// # URL
//
//	redis://[[user]:password@]host[:port][/db][?param=value&...]
//
// The port defaults to 6379 and the database to 0 (the path, or db).
// redis://:secret@host authenticates with the password alone (the
// default user), redis://user:secret@host as an ACL user; user info
// without a colon is a password too. Errors never show the password. One
// server only: Redis Cluster and Sentinel are not supported (a comma in
// the host is an error). TLS is the tls parameter (or tls_ca); there is no
// rediss:// scheme, because omnibus's schemes name transports.
//
// Parameters (the portable durability parameter is read by omnibus.Open;
// see Durability below):
//
//	parameter           default           meaning
//	name                omnibus           client name (CLIENT SETNAME), and the start of each member's consumer name
//	db                  0                 database number (or the URL's path)
//	tls                 false             connect with TLS (system roots)
//	tls_ca              -                 CA file; implies tls
//	dial_timeout        5s                connection set-up, bounded by Open's ctx
//	pool_size           10 per CPU        connections of the client's pool (go-redis PoolSize); each member reads on one more
//	claim_idle          30s               XAUTOCLAIM min-idle-time: an entry pending this long for a member is claimed by another (>= 100ms)
//	maxlen              0 (keep)          trim each stream to about this many entries (see Retention)
//	max_age             0 (keep)          trim entries older than this (MINID)
//	trim_unread         false             trim also entries a group has not read or acknowledged
//	max_message_bytes   proto-max-bulk-len  largest message: the server's limit (read at Open; 512 MiB when it cannot be read), or less
//	wait_timeout        5s                durability all: how long WAIT waits for the replicas
//	partitions          0 (none)          partitioned mode: streams per topic redisbus lays out
//	lease_ttl           10s               partitioned: life of a lane's lease not renewed (>= 500ms)
//	rebalance_interval  1s                partitioned: how often a member compares its share of lanes
//
// Unknown parameters are an error wrapping omnibus.ErrInvalid.
//
// # Topology
//
// A topic is a stream whose key is the topic's name, so other Redis
// clients XADD to it by name; it appears with its first entry or group.
// Every other key redisbus keeps starts with the topic's name, then a
// colon (so a topic's keys are SCAN MATCH "<topic>*"):
//
//	key                          type        holds
//	<topic>                      stream      the messages (unpartitioned)
//	<topic>:<N>                  stream      partition N's messages (partitioned)
//	<topic>:partitions           string      the partition count of a partitioned topic
//	<topic>:positions            hash        where each group resumes, per stream (field <group>, or <group>:<N>)
//	<topic>:members:<group>      sorted set  the group's live members (score: when their heartbeat runs out)
//	<stream>:runs:<group>        hash        how many holders ran each redelivered entry of stream <topic> or <topic>:<N> (field <entry ID>; see Delivery semantics)
//	<topic>:<N>:lease:<group>    string      partitioned: the lease of lane N ("<member>/<token>", PX lease_ttl)
//	<topic>:fence:<group>        string      partitioned: the counter the fencing tokens come from
//
// A consumer group is a Redis consumer group of that name on each of the
// topic's streams; every group receives every message. A new group
// starts at the stream's end ($), or at its first entry with
// StartEarliest. Each member is a Redis consumer named "<name>-<ID>" (a
// new ID per member) and reads with XREADGROUP; the members of a group
// compete for its entries.
//
// A group also records where it resumes on each stream, in the topic's
// positions hash: the ID before its lowest pending entry, or its last
// read entry when none is pending. Members write it when they join,
// every claim_idle/4 (partitioned: lease_ttl/4, for the lanes they hold),
// when they hand a lane over and when they leave; it only rises. Redis
// keeps a group's position in the group itself, so a group destroyed
// behind its members' backs (XGROUP DESTROY) would otherwise start again
// at the end of the stream: a member joining a group that is missing
// creates it at the record, and a member whose read finds its group gone
// creates it again there (at the stream's first entry without a record)
// and logs a warning. What the group read after the last record comes
// again: redeliveries, never a skip.
//
// A throwaway group (one the user did not name, SubscribeOptions.Ephemeral)
// leaves nothing behind: its last member on the connection destroys the
// group and deletes its keys when it closes. A crashed member's
// throwaway group stays until deleted (XGROUP DESTROY).
//
// For tools, the connection (omnibus.Client.Driver) has TopicExists,
// DeleteTopic (the topic's streams, with their entries and groups, its
// partition count and positions) and DeleteGroup (the group on the
// streams and every key of the group above; it reads the partition
// count, so delete a topic's groups before the topic); a topic or group
// that does not exist is no error. The CLI's bench removes what it made
// with them.
//
// # Partitioned mode
//
// With partitions=N, a topic redisbus lays out has N streams,
// "<topic>:0" ... "<topic>:N-1", and the key "<topic>:partitions" holding
// N; CreateTopic(topic, n) lays out n (and grows an existing topic to n,
// which remaps keys, as on Kafka). A message goes to partition
// [driver.Partition](key, N) (FNV-1a of the key modulo N); messages
// without a key go round robin. Publishing or subscribing with a URL
// whose mode does not match a topic's layout is an error (ErrInvalid)
// that says which.
//
// Each partition is a lane ("0" ... "N-1"), ordered, and read by one
// member of a group at a time, the holder of its lease:
//
//   - a lease is a key per lane and group, taken with SET NX PX lease_ttl
//     (by a script that first draws a fencing token from the group's
//     counter with INCR); its value is "<member>/<token>". The holder
//     renews it every lease_ttl/4, only while it still holds its value,
//     and stops using it when three quarters of lease_ttl have passed
//     since its last renewal began, before the server can expire it: from
//     then on nothing of the lane is delivered or acknowledged, and the
//     engine gets Lanes.Lost at that moment, from a watchdog, even while
//     another lane drains. The member claims a lost lane again only after
//     that Lanes.Lost returned (the engine hears Lost before the next
//     Claimed). Only the server's clock expires a lease; members never
//     compare clocks.
//   - the token fences every operation on the lane's stream: the member
//     reads new entries (XREADGROUP, without blocking), takes over
//     pending ones (XAUTOCLAIM) and acknowledges (XACK) only through
//     scripts that first check that the lease still holds its value, all
//     in one atomic step on the server. A member that finds its lease gone
//     (expired and maybe taken, or its refresh cut off) learns it from
//     the script and stops at once; it waits for new entries with a
//     plain XREAD BLOCK, which takes nothing.
//   - every rebalance_interval a member renews its heartbeat in the
//     group's members set and reads the leases, counts the live members n,
//     and balances by count, KCL-style: it takes free lanes up to
//     ceil(N/n) (up to floor(N/n) while another member has fewer than
//     that), gives up one at a time while it holds more than ceil(N/n),
//     and, when none is free and a member has fewer than floor(N/n), the
//     most loaded member (the lowest ID among equals) gives one up.
//     Members beyond N get no lane (exclusive lanes).
//
// Handing a lane over, in order. A member gives a lane up by stopping
// its reads (a Receive in progress returns at once), calling
// Lanes.Revoked (the engine drains the lane within its drain bound and
// acknowledges what it finished), recording the group's position and
// deleting its lease. The next owner first takes over every entry still
// pending in the group on that stream (XAUTOCLAIM from the start with no
// idle time, checked against its lease): what the previous owner left
// unacknowledged, whether it handed the lane over, crashed or froze,
// comes first, in ID order, then new entries. Redis keeps exactly which
// entries are pending, so nothing acknowledged comes again, and an
// entry's delivery count goes on across owners (Delivery.Attempt). A
// crashed member's lanes move after lease_ttl.
//
// Compared with natsbus's leases: both keep a lease per lane with a
// server-side expiry, renew every ttl/4, stop at 3/4 ttl, report Lost
// from a watchdog and balance by count the same way. What differs is the
// fence. A JetStream lease (a KV key written on revision) does not guard
// the partition's consumer: a member frozen past its lease can still
// have a pull request waiting on the server, which only pinned-client
// priority groups (nats-server 2.11 and later) cut off; and a new owner
// resets the consumer at its ack floor, so messages acknowledged out of
// order above it come again and delivery counts start over. Here the
// stream's reads and acknowledgements are themselves checked against
// the lease's token on the server, on every Redis version: a member that
// wakes past its lease can neither read nor acknowledge. And the new
// owner claims the pending entries as Redis lists them, so nothing
// acknowledged is redelivered. What neither can stop: a handler already
// running when its member froze finishes, possibly while the next owner
// handles the same message again.
//
// A member balances the partitions the topic had when it joined: after
// CreateTopic grows a topic, the new partitions are read once members
// join (or rejoin) the group.
//
// A partitioned member that loses a read's reply (the connection broke
// after the server read for it) takes over, before reading on, the
// entries pending for it after the last entry it got: the lost read's,
// which are newer than everything it delivered, so order holds.
//
// # Messages on the wire
//
// A message is a stream entry in CloudEvents binary content mode, the
// attributes spelled as the Kafka protocol binding spells its headers
// (there is no Redis binding):
//
//	field        stream entry field
//	ID           ce_id
//	Key          ce_partitionkey (and the partition, see above)
//	Type         ce_type
//	Source       ce_source
//	Time         ce_time (RFC 3339 with nanoseconds)
//	ContentType  content-type
//	Body         data (the last field)
//	             ce_specversion: 1.0
//	Headers      ce_<name> for a name of lowercase letters and digits
//	             ("tenant": ce_tenant, a CloudEvents extension), <name>
//	             for any other ("trace-id")
//
// A header named data, content-type or ce_* is refused on publish. An
// entry written by another client is read the same way: every field but
// data and the ce_* attributes is a header, and an entry without ce_id
// takes its entry ID as its message ID.
//
// # Delivery semantics
//
// At least once. Deliveries are acknowledged with XACK, in batches, as
// the engine settles them. Delivery.Position is the entry ID and
// Delivery.Attempt the entry's delivery count in the group (1 for a new
// entry; the count after the claim for one claimed from another member).
// Retries are the engine's, in place (redisbus has no native delayed
// redelivery, so it implements no driver.Nacker): a failed message is
// handled again by the same member after the backoff, and dead-lettered
// after MaxAttempts.
//
// A message whose handler crashes its process each time is dead-lettered
// after MaxAttempts processes ran it, and the others held beside it are
// not (the engine runs a redelivered entry only after acknowledging what
// came before it). An entry's delivery count alone cannot tell that: it
// also counts the claims of members that never ran the entry (a crashed
// member held it behind the poisoned one, then the next member, or the
// lane's next owner, took it over with XAUTOCLAIM, which counts a
// delivery), so such an entry would reach MaxAttempts first and be
// dead-lettered though it never crashed anything. So a group counts the
// holders that ran each redelivered entry (driver.RunCounter), in the
// hash "<stream>:runs:<group>": when the engine is about to run an entry
// whose delivery count is above 1, the member records its run there, by
// a script, and the entry's attempt is the holders that ran it, its first
// holder counted as one. A record keeps the delivery count it was written
// at, so that a record left by a group or stream of the same name before
// (whose entry IDs can come again) is not taken for the entry's; a group
// redisbus creates starts with no records. The acknowledgement deletes
// the records of its entries (partitioned, in the script that checks the
// lease; unpartitioned, in the XACK's pipeline), a claim those of entries
// trimmed while pending, and a throwaway group's go with it.
//
// Unpartitioned, a member that dies leaves its entries pending in the
// group; every member claims entries idle for claim_idle (XAUTOCLAIM,
// every claim_idle/4, at most every 5 seconds, when it has room to read),
// so the others handle them. While a member holds an entry (in the
// engine, a handler or waiting behind a retry) its keeper claims it again
// every claim_idle/4 without counting a delivery (XCLAIM JUSTID, by a
// script that touches only entries still the member's), so a slow
// handler or a long queue never lets claim_idle run out. A member that
// leaves (Close, after the engine's drain) hands back what it did not
// settle at once (their idle time set to claim_idle, so any member's
// next claim takes them), and deletes its consumer when nothing is left
// pending for it (a claim that takes back an entry the member still
// holds, its keeper late, does not deliver it again); members delete the
// consumers of crashed members once
// their entries were claimed (idle for ten times claim_idle, nothing
// pending). An entry a member read but never got (a reply lost with its
// connection) is claimed after claim_idle like a dead member's.
//
// A member holds at most one read beyond the engine's MaxInFlight and
// MaxInFlightBytes: reads ask for the engine's whole window (per lane when
// partitioned), MaxInFlight entries and, at the mean size of the previous
// read's entries, MaxInFlightBytes; what the engine has no room for yet
// waits in the member, first in line. The next read is made while the
// engine works on the last.
// Reads run on a connection of the member's own, so a blocking read
// (XREADGROUP BLOCK, XREAD BLOCK, at most 2 seconds) never holds a pooled
// connection; a new lane and Close end one with CLIENT UNBLOCK (Close
// then closes the connection).
//
// The client does not retry commands (go-redis MaxRetries -1): a
// connection that breaks fails the command, the engine retries the read
// with its backoff, an acknowledgement that failed goes with the next
// one (or the keeper's, or the refresher's), and the pool dials again.
// Such an error is marked driver.ErrOutcomeUnknown (driver.ErrRetryable
// when no connection could be made, or the server answered LOADING,
// BUSY or TRYAGAIN), so omnibus.Publish publishes the messages again
// with the same IDs; Redis keeps no window of IDs, so an entry that had
// landed is then stored twice. A batch of Publish is one pipeline of
// XADDs; on a partitioned topic, one transaction (MULTI/EXEC), stored
// whole or not at all, since in a pipeline the server may refuse the
// first commands (LOADING while a restarted server reads its data) and
// run the next, and the messages published again would land behind newer
// ones of their key (TestRestart saw it). The transaction costs nothing
// measurable (omnibus bench on 4 partitions, 2 alternated runs: 72-77 k
// msgs/s without, 78-81 k with).
// A member that leaves tries those a last time; when that fails too,
// Close (and so Consumer.Shutdown) says how many settled entries go
// back to the group, to be delivered again. A
// server restart loses nothing the server kept (see Durability): groups,
// pending entries and positions are in the dataset.
//
// # Retention
//
// Redis keeps a stream's entries until they are trimmed, acknowledged or
// not. maxlen and max_age trim the streams a client publishes to, at most
// once a second per stream, by a script: it removes the oldest entries
// beyond maxlen, and those older than max_age (MINID, by the server's
// clock), but never an entry a group of the stream still needs: none at
// or after the lowest of each group's lowest pending entry and last read
// entry. So a group that stops reading stops trimming: delete groups
// nobody reads (XGROUP DESTROY), or set trim_unread=true to trim by
// maxlen and max_age alone (a group then loses what was trimmed before it
// read it; its pending entries that were trimmed are logged and
// dropped when claimed). One trim looks at no more than 10,000 entries,
// so a long backlog is trimmed over several.
//
// # Durability
//
// Redis acknowledges an XADD once the entry is in the primary's memory.
// What outlives a crash or restart of the server is what its persistence
// wrote: an append-only file (appendonly yes; appendfsync always loses
// nothing acknowledged, everysec up to a second), or RDB snapshots
// (everything since the last one is lost). A server with neither
// (save "" and appendonly no, as the Redis the omnibus project tests
// against runs) loses every stream, group and recorded position when it
// restarts: at least once then holds only while the server runs.
//
// The portable durability parameter maps onto what Redis can wait for:
//
//	durability  redisbus
//	all         XADD, then WAIT until every replica connected to the primary has the batch
//	            (the count read from INFO replication at most once a second; wait_timeout);
//	            fewer in time is an error (the entry is on the primary: publishing
//	            again duplicates it); with no replica, the same as leader
//	leader      the primary's reply to XADD
//	none        the same as leader: go-redis reads every reply, so a publish
//	            always waits for it
//
// No level waits for the disk: WAITAOF is Redis 7.2 and later, and
// redisbus does not use it.
//
// # Lag and limits
//
// Lag is XINFO GROUPS lag (entries the group has not read) plus pending
// (read and not acknowledged), per lane (LagDepth); Redis cannot tell the
// lag after entries were deleted from the middle of a stream (XDEL), and
// the lane is then Known false. Each lane's age (LaneLag.Age) is that
// of the group's oldest unsettled entry: its lowest pending entry
// (XPENDING), else the first entry after its last-delivered-id; an entry
// ID begins with the server's time of the XADD in milliseconds, and the
// age is the server's time (TIME) minus that, so it is not off by the
// clocks of the machines. A lane with nothing unsettled has age 0. An
// entry another client added with an ID of its own choosing has the age
// that ID says. Client.Lag (and the CLI's omnibus lag)
// read it without joining the group (driver.GroupLagReader); a topic
// without the group is ErrNotFound. GroupMembers counts the live
// heartbeats in the group's members set.
//
// The largest message is the server's proto-max-bulk-len (one bulk
// string: the body), read with CONFIG GET at Open, or max_message_bytes;
// a larger message is refused before it is sent (ErrTooLarge), since
// the server answers one with a protocol error and closes the connection.
//
//	capability       unpartitioned (default)             partitions=N
//	ordered lanes    no (one unordered lane, "0")        yes (lanes "0" ... "N-1", one member each)
//	native nack      no (the engine retries in place)    no
//	lag              depth (lag + pending, per lane), and age
//	exclusive lanes  no                                  yes (at most N members get work)
//	groups           yes                                 yes
//	replay           yes (a group created at 0)          yes
//	max message      proto-max-bulk-len                  proto-max-bulk-len
//
// # Concurrency
//
// Everything is safe for concurrent use. Each client holds one go-redis
// pool; each group member adds a connection and a reader goroutine
// (reads for Receive), and, unpartitioned, a keeper goroutine (held
// entries, heartbeat, positions, reaping); partitioned, a balancer
// (heartbeat, claims and releases: Lanes.Claimed and Lanes.Revoked), a
// refresher (leases, positions) and a watchdog (lease deadlines:
// Lanes.Lost). All end in the member's Close.
package redisbus

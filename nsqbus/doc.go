// Package nsqbus is omnibus's NSQ transport, scheme nsq://, built on
// github.com/nsqio/go-nsq and tested against nsqd and nsqlookupd 1.3
// (started by the tests themselves from the nsq module's packages; see
// internal/nsqtest).
//
// Import it for its side effect:
//
//	import _ "github.com/omnibus-go/omnibus/nsqbus"
//
//	c, err := omnibus.Open(ctx, "nsq://127.0.0.1:4150")
//	c, err := omnibus.Open(ctx, "nsq://lookupd1:4161,lookupd2:4161?lookup=true")
//
// # URL
//
//	nsq://[SECRET@]host[:port][,host[:port]...][?param=value&...]
//
// Without lookup the hosts are nsqd TCP addresses (port 4150 by
// default): consumers connect to every one, and publishing goes to them
// in turn. With lookup=true they are nsqlookupd HTTP addresses (port
// 4161 by default): consumers find the nsqds holding their topic
// through nsqlookupd (go-nsq's ConnectToNSQLookupds), and publishing
// goes in turn to the nsqds registered with it (/nodes). The secret, for
// nsqd's --auth-http-address, is the user info (nsq://SECRET@host, or
// nsq://:SECRET@host); errors and logs never show it. Unknown parameters
// are an error, and so is a URL without a host. In a list of hosts give
// each its port: Go's URL parser refuses "a:4150,b" (it reads the port
// after the last colon), and IPv6 addresses only alone ("[::1]:4150").
//
//	parameter              default       meaning
//	durability             all           none | leader | all, read by package omnibus (below)
//	lookup                 false         true: the hosts are nsqlookupd HTTP addresses
//	http_port              TCP port + 1  nsqd's HTTP port (direct mode), for channels, limits and lag
//	msg_timeout            60s           how long nsqd waits for FIN before it delivers again (IDENTIFY msg_timeout)
//	max_message_bytes      (nsqd's)      the largest message to send, as encoded; at most nsqd's --max-msg-size, read from it
//	poll_interval          5s            how often consumers ask nsqlookupd for nsqds, and wait to dial a lost nsqd again
//	dial_timeout           5s            bound on TCP connects and on each HTTP call
//	envelope               json          json | binary: how messages are published (below); both are read
//	output_buffer_size     -1            bytes nsqd buffers before it writes to a consumer; -1: none (IDENTIFY output_buffer_size)
//	output_buffer_timeout  250ms         how long nsqd waits to fill the buffer; given alone, the buffer is 16384 bytes (IDENTIFY output_buffer_timeout)
//
// Without a buffer nsqd writes each message to its consumer at once,
// so a message reaches its handler in a fraction of a millisecond
// (BenchmarkLatency: p50 0.2 ms). NSQ's own default, a buffer of 16 KiB
// flushed every 250ms, keeps a message on a quiet topic until the
// buffer fills or the timer fires: at 1,000 messages a second, 28 ms at
// the median and 250 ms at worst, and a request and its reply wait
// twice. Under load the buffer saves nsqd a write per message: without
// it, nsqd's processor time per message consumed doubles (6 to 11-14 us
// at 100 B and 1 KiB, BenchmarkConsume). Consumers that care more for
// nsqd's processor time than for latency set output_buffer_size (16384
// is NSQ's default), and output_buffer_timeout if not 250ms (at least
// nsqd's --min-output-buffer-timeout, 25ms by default). Settings nsqd
// refuses fail Open with its reason.
//
// # Topology
//
// A topic is an NSQ topic; a consumer group is a channel of it, named
// after the group; the members of a group are consumers of the channel
// and compete for its messages. A group omnibus names itself (no Group
// option) is an ephemeral channel ("<group>#ephemeral"), which nsqd
// deletes with its messages when its last consumer leaves, and which
// keeps at most nsqd's --mem-queue-size messages (nsqd drops the
// overflow of an ephemeral channel). NSQ takes names of ASCII letters,
// digits, '.', '_' and '-', up to 64 bytes: other characters are an
// error (ErrInvalid), and a longer name is cut to its first 55 bytes and
// a hash of the whole, the same in every client.
//
// Subscribe creates the topic and the channel on every nsqd holding the
// topic (in lookup mode every nsqd registered when none holds it yet)
// through nsqd's HTTP API, before it connects, so a message published
// after Subscribe returns reaches the group. A new channel gets what is
// published after it exists, except that the first channel of a topic
// gets what the topic kept meanwhile (NSQ keeps messages of a topic with
// no channel): there is no replay. Dead letters go to "<topic>.dlq" (by
// default), a topic like any other, which keeps them until a channel
// reads them. omnibus deletes no topic and no channel unless asked: for
// tools, the connection (omnibus.Client.Driver) has TopicExists (an nsqd
// holds the topic), DeleteTopic (the topic, with its channels, on every
// nsqd) and DeleteGroup (the group's
// channel, with the messages it holds, on every nsqd holding the topic);
// a topic or group that does not exist is no error. The CLI's bench and
// demo remove what they made with them.
//
// # Messages on the wire
//
// NSQ carries a body and nothing else, so a message travels as a
// CloudEvent in the JSON event format (structured content mode, content
// type application/cloudevents+json), which any CloudEvents reader
// understands:
//
//	field        JSON event member
//	ID           id
//	Key          partitionkey (NSQ has no key: it orders and routes nothing)
//	Type         type
//	Source       source
//	Time         time (RFC 3339 with nanoseconds)
//	ContentType  datacontenttype
//	Body         data (a JSON body of a JSON content type, as it is;
//	             a text/* body in UTF-8 as a JSON string, where no
//	             larger than in base64), else data_base64
//	             specversion: 1.0
//	Headers      a member of the header's name when it is an attribute
//	             name (lowercase letters and digits: "tenant", an
//	             extension); the others ("trace-id") together in the
//	             extension omnibusheaders, a JSON object in a string
//
// With envelope=binary a message travels in omnibus's binary envelope
// instead: the bytes "\x00OMB\x01", the attributes that are set (ID,
// source, type, key, content type, each a tag, a uvarint length and the
// bytes; the time as a tag and 8 bytes of Unix nanoseconds; every
// header as a tag and its name and value, length-prefixed), a 0 byte,
// and the body as it is. Readers take both envelopes whatever their
// URL says, so publishers can switch once every reader runs a version
// that reads it (an omnibus before it delivers such a message as a
// foreign body, the envelope included); a CloudEvents reader other than
// omnibus cannot read it. A body that is neither envelope (a producer
// other than omnibus) is delivered as it is, with NSQ's message ID as
// the ID and its timestamp as the time. Delivery.Position is NSQ's
// message ID. A binary body takes 4 bytes for 3 in base64, so
// Capabilities' MaxMessageBytes is (max-msg-size - 512) x 3/4, or
// max-msg-size - 512 with envelope=binary.
//
// Why a second envelope, and why not the default: what a publish costs
// follows the bytes, at nsqd above all, which reads each message into a
// buffer of its own and keeps it. A binary body of 100 bytes is a JSON
// event of 242 (the body in base64, member names, the time as text) and
// a binary envelope of 137; at 1 KiB, 1,474 and 1,061. Measured against
// raw go-nsq publishing the bare bodies (MPUB of 100, one nsqd, medians
// of 20 alternated rounds on a 2-core machine shared with other work,
// rate ratios): the JSON event reaches 0.6-0.7 at 100 B and 0.75-0.9 at
// 1 KiB, the binary envelope 0.8-0.85 and 1.4. At 100 B what remains is
// the collector's work on the allocations of the caller and the engine
// per message (with GOGC=400 the binary envelope reaches 0.91). The
// options weighed: putting the body in "data" rather than data_base64
// already happens where the content type allows (JSON in a JSON type,
// text/* in UTF-8) and cannot hold arbitrary bytes; sending a batch in
// smaller MPUB commands as it is encoded, to overlap the client's work
// with nsqd's, made it slower (0.42 at 100 B, 0.37 at 1 KiB: each
// command is a round of wake-ups on both sides); encoding is no longer
// what counts (a batch of 100 messages of 100 B takes about 15 us in
// JSON, 3 us in binary, BenchmarkEncodeBatch). The JSON event stays the
// default because it is what any CloudEvents reader understands, which
// users of a topic other than omnibus may rely on.
//
// # Delivery semantics
//
// Publishing: PUB for one message, MPUB for more. A batch larger than
// nsqd's --max-body-size goes out in several MPUB commands, each sent as
// soon as it is encoded; they are pipelined on one connection per nsqd
// and waited for together. A Publish is therefore not atomic: some of
// its messages can land and others fail (a *driver.MessageErrors). nsqd answers once the message is in
// the topic's memory queue or on disk: there are no replicas, so leader
// and all are the same. With durability none Publish does not wait for
// the answer (at most once). A message over max-msg-size once encoded
// fails alone with ErrTooLarge, before anything is sent. If nsqd refuses
// an MPUB as too big anyway (its limit could not be read, and
// max_message_bytes or the default is above it), nothing of it was
// stored, and each message is sent alone to find which fail. nsqd closes
// a connection after refusing a command and runs nothing sent after it,
// so those commands are sent again on a new connection; but when it
// closes before reading the refused message's body, the connection is
// reset, the answers not yet read are lost with it, and the commands
// waiting for them fail as below.
// A command whose connection dropped before nsqd answered fails with an
// error that says it may or may not be stored, marked
// driver.ErrOutcomeUnknown, which omnibus.Publish sends again with the
// same IDs (at least once: a duplicate when nsqd had stored it).
//
// Consuming: at least once. A member is a go-nsq Consumer of the
// channel; it buffers what nsqd sends and the engine takes it. Its
// in-flight window (RDY, spread by go-nsq over its connections) is the
// engine's MaxInFlight, narrowed to what fits in MaxInFlightBytes at the
// size of the messages received so far (a moving average), since nsqd
// sends as many messages as the window whatever their size and each
// starts timing out when it is sent. Settling is FIN; a retry is REQ with
// the engine's delay (at most nsqd's --max-req-timeout), so nsqd
// delivers the message again after the delay, to any member: native
// delayed redelivery, with no backoff state (go-nsq's backoff and its
// max_attempts are off; the engine counts attempts and dead-letters).
// Delivery.Attempt is the message's attempt count, which nsqd raises on
// every delivery, timeouts and REQ included. FIN has no answer in NSQ's
// protocol and go-nsq writes it after Finish returns, so Ack returns
// before nsqd has the FIN: a process that crashes (the engine runs a
// redelivered message only after settling what came before it, for that
// case) can lose the FINs of the messages it handled last, which come
// back with their count raised, and one of those can reach MaxAttempts
// and be dead-lettered with a message that crashed its holders, though it
// never crashed anything. Every message a member
// holds (buffered, or in the engine) is touched (TOUCH) once it has been
// held a quarter of msg_timeout since it arrived or was last touched, so
// a slow handler keeps its message; nsqd stops
// extending at its --max-msg-timeout (15 minutes by default) after the
// delivery, and the message is then delivered again. A member that dies
// without closing leaves its messages in flight until msg_timeout, then
// nsqd delivers them to the other members. Close stops the consumer
// (CLS) and hands back at once (REQ without delay) everything the member
// holds unsettled. NSQ keeps no order: the group is one unordered lane,
// "0" (Capabilities.Ordered is false), and OrderKey, OrderLane and
// StartEarliest are refused with a *CapabilityError at Subscribe.
//
// Durability of the server: nsqd keeps up to --mem-queue-size messages
// per topic and channel in memory and the rest on disk. Stopped
// gracefully (SIGTERM) it writes everything, in flight included, to its
// data directory and delivers it again after a restart; a crash
// (SIGKILL, power loss) loses what was in memory.
//
// Lag is one lane's, in messages: the channel's depth (memory and disk),
// in flight and deferred (REQ with a delay), from /stats of every nsqd
// holding the topic. A read that fails gives Known false. The connection
// also reads a group's lag from outside the group (GroupLag, which
// omnibus lag uses).
//
// The lane's age (LaneLag.Age) is known only where it is certain: /stats
// shows no message's time, and a message carries its own (nsqd's time of
// the PUB) only when it is delivered. It is the age of the oldest
// message this client's members hold on the channel, where that is the
// channel's oldest: on every nsqd with a lag, every message in flight is
// held here, none is deferred, and the channel has never requeued or
// timed out a message and has none on disk, topic or channel (nsqd's
// memory queues are first in, first out; a requeued message goes back
// behind newer ones, and one on disk may come out before older ones in
// memory). A channel with no lag has age 0. Anywhere else it is unknown,
// never 0: from another process (omnibus lag), and on a channel that has
// retried a message, until it is empty.
//
// # Reconnection
//
// go-nsq's consumer dials a lost nsqd again every poll_interval (direct
// mode) or finds it again through nsqlookupd; messages delivered on the
// lost connection are settled nowhere and come back after msg_timeout
// (or at once when nsqd stopped gracefully, since it saved them).
// Publishing dials again on the next Publish, and tries the next nsqd
// when one cannot be reached.
//
//	capability       nsqbus
//	ordered lanes    no (one unordered lane per channel)
//	lag              depth (depth + in flight + deferred), and age where certain
//	exclusive lanes  no
//	groups           yes (channels)
//	replay           no
//	native nack      yes (REQ with delay)
//	max message      (max-msg-size - 512) x 3/4; max-msg-size - 512 with envelope=binary
//
// # Errors
//
// Open connects to the first nsqd (direct mode: IDENTIFY, and AUTH with
// the secret) or asks the nsqlookupds for their nsqds, so an unreachable
// cluster or a refused secret fails there, within dial_timeout and the
// context, naming the address. In direct mode Subscribe fails when one
// of the URL's nsqds cannot be reached (go-nsq dials an nsqd again only
// after losing a connection it had), and a consumer that lost one dials
// it every poll_interval (go-nsq's wait is not cut short by Close, so
// its goroutine may outlive Close by up to poll_interval).
//
// go-nsq reads the size of an answer and allocates it without a bound:
// another protocol's first bytes read as hundreds of megabytes (Redis's
// "-ERR" as 759 MB), which it then waits a minute for. So before go-nsq
// connects to an nsqd for Open, Publish or Subscribe, nsqbus connects
// on its own, sends IDENTIFY and reads at most 64 KB of the answer,
// within dial_timeout and the context: a server that answers in another
// protocol fails with an error wrapping driver.ErrInvalid that quotes
// its first bytes (Publish goes on to the URL's next nsqd), one that
// says nothing fails when dial_timeout ends. Connections go-nsq makes
// again on its own (a consumer's nsqd lost, or named anew by
// nsqlookupd) are not checked. nsqlookupd's and nsqd's HTTP answers are
// read up to 64 MB. A topic or group name NSQ cannot take wraps
// driver.ErrInvalid; an oversized message ErrTooLarge; a Publish that
// reached no nsqd ErrRetryable.
//
// # Concurrency
//
// Everything is safe for concurrent use. A subscriber's Receive is called
// from one goroutine; Ack, Nack and Lag may be called concurrently with
// it.
package nsqbus

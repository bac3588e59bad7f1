// Package bus is a service bus over omnibus: services send each other
// typed commands (handled by one instance of the receiving service),
// publish typed events (handled once by every service that subscribes
// to them) and reply to the commands they handle, either to a handler of
// the sender or to a Request waiting for the answer. A [Bus] is one
// instance of a named service on an *omnibus.Client; handlers are generic
// functions of the message type ([HandleCommand], [HandleEvent],
// [HandleReply]), and the same service code runs unchanged on every
// transport, with the engine's retries, dead letters, ordering by key,
// batches and group members underneath.
//
//	b, err := bus.New(client, "billing")
//	err = bus.HandleCommand(b, func(ctx context.Context, inv bus.Invocation, c ChargeCard) error {
//		return inv.Reply(ctx, Charged{Order: c.Order})
//	})
//	err = b.Start(ctx)
//
//	// in the order service
//	err = orders.Send(ctx, "billing", ChargeCard{Order: "o-1"})
//	charged, err := bus.Request[Charged](ctx, orders, "billing", ChargeCard{Order: "o-2"}) // ctx has a deadline
//	err = orders.Publish(ctx, OrderPlaced{Order: "o-3"})
//
// # Topology
//
// The bus lays out its topics and groups itself, the same on every
// transport (the namespace is "bus" unless [Namespace] says otherwise):
//
//	what                        topic                          group
//	commands to service S       <namespace>.S.commands         S (one member handles each)
//	events published by S       <namespace>.S.events           each subscribing service's name
//	replies to S's instances    <namespace>.S.replies          a throwaway group per instance
//	dead letters                <topic>.dlq                    (none: read them with any client)
//
// Events go to one topic per publishing service, not per event type, so
// the events of one key (an order) keep their order across types where
// the transport's lanes are ordered, and a service reads one topic per
// publisher it listens to; the cost is that a subscriber reads (and
// skips, see Stats.Skipped) the publisher's event types it does not
// handle.
//
// Replies go to one topic per service, not per instance or per request.
// Every instance reads it in a throwaway group of its own and keeps the
// replies that name it (header replyinstance), dropping the others
// (Stats.OtherReplies). A topic per instance would be created at every
// start and left behind at every stop: the bus deletes no topic, and a
// crashed instance could not delete its own anyway (a Kafka topic, a
// RabbitMQ exchange, a JetStream stream all outlive their readers),
// whereas every transport removes a throwaway group when its instance
// leaves. A partition per instance, as some Kafka request/reply clients
// use, needs partitions assigned by hand, which a consumer group does
// not do. The price is that each instance of a service reads all of the
// service's replies: reply traffic is multiplied by the instance count,
// on logs and brokers alike.
//
// Per transport (the transport's package comment has the details):
//
//   - Kafka: each topic is created by the bus with [Lanes] partitions
//     (default 4); dead-letter topics are created by kafkabus on first
//     use. A service's group is one Kafka group (group.id S) whose
//     members read the service's command topic and its event
//     subscriptions; a member joining or leaving any of them rebalances
//     the group (cooperative-sticky: only moved partitions pause). An
//     instance's reply group is deleted from Kafka when the instance
//     leaves.
//   - RabbitMQ: each topic is a topic exchange; S's group is the queue
//     "<topic>:S"; an instance's reply queue expires after the instance
//     leaves (x-expires); a dead-letter topic has a queue of its own
//     that keeps the dead letters. A command sent to a service that has
//     never started is dropped by the server (no queue is bound yet;
//     the URL's mandatory=true makes Send fail instead).
//   - NATS JetStream: each topic is a stream; S's group is a durable
//     consumer; an instance's reply consumer is deleted when it leaves,
//     and by the server after inactive_threshold if it crashed.
//   - Redis Streams: each topic is a stream (partitions=N: N streams,
//     each a lane held by one member); S's group is a Redis consumer
//     group on each; an instance's reply group is destroyed when the
//     instance leaves.
//   - NSQ: each topic is an NSQ topic; S's group is the channel S; an
//     instance's reply channel is ephemeral (nsqd deletes it when the
//     instance leaves). NSQ keeps no order: the events of one key may
//     arrive out of order, and a command's retries go back to the
//     channel with nsqd's delay (REQ). A message sent to a topic no
//     service has started on waits in the topic for its first channel.
//   - membus: as Kafka, in memory.
//
// A service's group is created when the service first starts. From
// then on the transport keeps what is sent to it while no instance runs
// (on RabbitMQ, only from then on). Start returns once every group of
// the instance is in place, so messages sent after it are not missed.
//
// # Messages on the wire
//
// A bus message is an omnibus.Message, so a CloudEvent on every
// transport: its Type is the message type's name (a type's package name
// and its own, "shop.ChargeCard"; a proto.Message's full name; or what
// the type's MessageType method returns, see [Typer]); its Source is the
// sending service; its ContentType is the codec's; its Key is what the
// value's MessageKey method returns ([Keyer]: messages of one key are
// handled in order where lanes are ordered), and a reply's is the
// command's. The bus writes these headers, whose names are CloudEvents
// extension names, so CloudEvents readers and `omnibus tail` show them:
//
//	causationid    the ID of the message whose handler sent this one
//	correlationid  the conversation: the ID of its first message
//	replyto        commands: the sender's reply topic
//	replyinstance  commands and replies: the sending instance
//	requestid      commands sent by Request, and their replies
//
// A message sent from a handler, under the ctx the handler got (or
// [Invocation.Context]), is caused by the message being handled and
// joins its conversation; one sent elsewhere starts a conversation.
//
// Codecs: [JSON] by default ([WithCodec] sets another), [Protobuf] for
// every proto.Message type; a receiver decodes a body with the codec of
// its content type (JSON, protobuf, or the bus's codec), and a body
// without one with the codec of the handler's type.
//
// # Delivery semantics
//
// At least once: a command is handled by one member of the service's
// group at a time, an event by one member of each subscribing group,
// and a handler may see a message again after a failure or a
// rebalance (Invocation.Message().ID stays the same, for
// deduplication). A handler's result is the engine's: nil settles, an
// error retries with backoff, omnibus.Permanent dead-letters at once,
// MaxAttempts failures dead-letter; the options of [Subscribe],
// [SubscribeCommands] and [SubscribeEvents] reach the engine as they
// are (retries, the dead-letter topic, ordering, MaxInFlight, batches,
// Members for more group members, an omnibus.Observe for metrics).
//
// What the bus itself refuses is dead-lettered with the reason in the
// omnibus-dead-reason header, never dropped: a command or a reply of a
// type the receiver has no handler for ([ErrNoHandler]; Send cannot
// know what the receiver handles, so it returns nil), and a body that
// does not decode: no codec for its content type, or the codec failed
// ([ErrDecode]). Events of a type the subscriber has no handler for are
// settled unhandled: a service reads all the events of a publisher.
//
// # Request and reply
//
// [Request] sends a command and waits for its reply, bounded by ctx's
// deadline: a ctx without a deadline is refused ([ErrNoDeadline]), as a
// reply may never come. When the command is dead-lettered (the handler
// failed permanently or ran out of attempts, no handler, a body that
// does not decode), the handling service sends a fault and Request
// returns a [*FaultError]; while the handler fails transiently and is
// retried, Request waits, until its deadline. A fault for a command that
// ran out of attempts is sent after its dead letter, best effort: if
// the handling instance stops first, the Request waits for its
// deadline. A reply that comes after its Request ended, or a second
// reply (a command handled twice), goes to no one: it is dropped and
// counted in Stats.LateReplies. Replies to commands sent with Send go
// to the [HandleReply] handler of their type in the sending instance.
//
// # Middleware
//
// [Use] wraps handlers and [UseSend] wraps sends, in the same order on
// every transport: the first given is the outermost. On receipt, the
// bus finds the handler of the message's type and decodes the body,
// then runs the handler middleware around the typed handler; on a send,
// the bus encodes the values and sets their headers, then runs the send
// middleware around the publish. A batch handler's middleware sees the
// whole run of messages in one [Call].
//
// # Errors
//
// Errors wrap the bus's sentinels ([ErrDuplicateHandler],
// [ErrNoDeadline], [ErrNoReplyPath], [ErrNoHandler], [ErrDecode],
// [ErrStarted]) or omnibus's (omnibus.ErrInvalid for bad names and
// arguments, omnibus.ErrClosed), and the transport's error stays
// reachable with errors.As. A handler registered twice for one type and
// kind is an error at registration.
//
// # Concurrency
//
// A Bus may be used from any goroutine. Handlers run on the engine's
// goroutines, concurrently as the ordering mode allows. Start runs one
// omnibus.Consumer per topic the instance reads, each in a goroutine of
// the bus, and a fault for a command that ran out of attempts is sent
// from a goroutine of the bus too; Shutdown drains the consumers and
// Close stops them, and both wait for those goroutines.
package bus

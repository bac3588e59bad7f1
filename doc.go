// Package omnibus gives Go services one messaging API over message
// brokers (RabbitMQ, NATS JetStream, Redis Streams, NSQ) and distributed
// logs (Kafka, Kinesis), with an in-memory log (membus) for tests and
// examples.
//
// A transport is named by a URL, and plugs in like a database/sql driver:
// a blank import registers its scheme.
//
//	import _ "github.com/omnibus-go/omnibus/kafkabus"
//
//	c, err := omnibus.Open(ctx, "kafka://localhost:9092")
//	err = c.Publish(ctx, "orders", &omnibus.Message{Key: "customer-7", Body: b})
//	k, err := c.Subscribe(ctx, "orders", handle, omnibus.Group("billing"))
//	err = k.Run(ctx)
//
// # Lanes
//
// A lane is the unit of ordered delivery: a Kafka partition, one
// partition queue of a broker's partitioned mode, or the single
// unordered lane of a plain queue. Members of a consumer group share the
// lanes; inside a lane the engine runs handlers in the chosen [Ordering]:
// one at a time per lane, in order per key while keys run concurrently
// (the default where lanes are ordered), or fully concurrently.
//
// # Delivery semantics
//
// At least once, on every transport. A handler's nil settles the message;
// an error retries it with exponential backoff and jitter; a [Permanent]
// error, or MaxAttempts failures, dead-letters it to the dead-letter topic
// with headers that say why (HeaderDeadReason and the rest). A panic is
// recovered and counts as a failure. On logs the engine commits per lane
// the highest position below which everything is settled; on brokers it
// acknowledges message by message. Each transport's package documents what
// it guarantees beyond this, and [Client.Capabilities] reports it: a
// subscription that asks for more than the transport can keep fails with a
// [*CapabilityError] before anything runs.
//
// # Errors
//
// Errors wrap the sentinels [ErrClosed], [ErrNotFound], [ErrUnsupported],
// [ErrTooLarge], [ErrInvalid] and [ErrUnknownScheme] where they apply, and
// the transport client's own error stays reachable with errors.As. A
// URL's password never appears in an error or a log line.
//
// # Concurrency
//
// A [Client] and a [Consumer] may be used from any goroutine. Handlers run
// on the engine's goroutines, concurrently as the ordering mode allows;
// Shutdown drains them and Close stops them. No goroutine outlives Close;
// Shutdown, at its deadline, does not wait for a handler that ignores its
// context.
package omnibus

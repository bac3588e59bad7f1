// Package otelomnibus traces and measures omnibus with OpenTelemetry: a
// producer span per Publish, a consumer span per handling, the trace
// context carried between them in the messages' headers, and metrics,
// following OpenTelemetry's messaging semantic conventions (semconv
// v1.43.0), on every transport.
//
//	hook, err := otelomnibus.New() // the global tracer and meter providers
//	c, err := omnibus.Open(ctx, url, omnibus.WithHooks(hook))
//
// Registered on a client (omnibus.WithHooks), the hook sees its publishes
// and every consumer it makes; registered on one consumer
// (omnibus.Hooks), that consumer only. One Hook serves any number of
// clients and consumers.
//
// # Trace context in messages
//
// The producer span's context travels in the W3C traceparent and
// tracestate headers, which are the CloudEvents distributed-tracing
// extension's attributes: ce_traceparent on Kafka, cloudEvents:traceparent
// on RabbitMQ, ce-traceparent on NATS (and traceparent in membus), so
// other CloudEvents and OpenTelemetry clients continue the trace, and a
// consumer continues theirs. A message that already carries a
// traceparent (forwarded from another message, or set by its producer)
// keeps it, and the producer span links to it, as the conventions ask.
// The hook adds the header to a copy of each message's Headers map, so a
// map shared by several messages is not written.
//
// # Spans
//
//	span            kind      name               parent                         links
//	Publish         PRODUCER  publish <topic>    the Publish context's span     creation contexts messages carried
//	handling of 1   CONSUMER  process <topic>    the message's creation context the creation context
//	handling of N   CONSUMER  process <topic>    none (a new trace)             each message's creation context
//
// A consumer span's parent is the message's creation context, so a
// message published inside a traced request continues that request's
// trace, retries included (each attempt is a span, a child of the same
// producer span). The conventions ask a process span to link to each
// message's creation context, and leave its parent open; it also links,
// so tools that follow links find it either way. A batch has many
// creation contexts, so its span starts a trace and links to them. A
// message without a trace context starts a trace of its own: a
// handling never becomes a child of a span the Subscribe context
// happened to carry (its values still reach the handler).
//
// Attributes: messaging.system (kafka, rabbitmq, nats, membus; see
// System), messaging.operation.type (send, process),
// messaging.operation.name (publish, process), messaging.destination.name
// (the topic), messaging.consumer.group.name (the group),
// messaging.destination.partition.id (the lane, when the messages share
// one), messaging.message.id and messaging.message.body.size (one
// message) or messaging.batch.message_count (several),
// messaging.kafka.message.key and messaging.kafka.offset on Kafka, and
// omnibus.message.attempt (the delivery attempt). A failed Publish or
// handling sets the span's status to Error, error.type, and records the
// error.
//
// # Metrics
//
//	instrument                             kind       unit       what
//	messaging.client.sent.messages         counter    {message}  messages published (error.type when failed)
//	messaging.client.operation.duration    histogram  s          Publish calls
//	messaging.client.consumed.messages     counter    {message}  messages handed to handlers, per attempt
//	messaging.process.duration             histogram  s          handler calls (error.type when failed)
//	omnibus.consumer.retries               counter    {retry}    retries scheduled
//	omnibus.consumer.dead_letters          counter    {message}  messages dead-lettered
//	omnibus.consumer.dead_letter_failures  counter    {attempt}  dead-letter publishes that failed
//	omnibus.consumer.lane_changes          counter    {lane}     lanes claimed, revoked, lost (omnibus.lane.change)
//	omnibus.consumer.members               gauge      {member}   group members the consumer runs here
//	omnibus.consumer.in_flight             gauge      {message}  received and not settled, per lane
//	omnibus.consumer.lag                   gauge      {message}  the group's lag per lane, as the transport counts it
//	omnibus.consumer.time_lag              gauge      s          age of the oldest unsettled message per lane
//
// A consumer's metrics carry messaging.system, messaging.destination.name
// and messaging.consumer.group.name, and those of a lane
// messaging.destination.partition.id. The gauges are read when the
// meter collects, from each running consumer's Stats and Lag (each lag
// read bounded by 5 s); a lane whose lag the transport cannot tell has
// no value, never 0, and a consumer that stopped is dropped.
// omnibus.consumer.time_lag has values once transports report the age
// of a lane's oldest message.
//
// # Concurrency
//
// A Hook is safe for concurrent use; it runs on the engine's goroutines,
// within the contract of omnibus.Hook.
package otelomnibus

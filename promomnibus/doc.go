// Package promomnibus exports omnibus's metrics to Prometheus: a
// Collector that is both a prometheus.Collector and an omnibus hook.
//
//	col := promomnibus.New()
//	prometheus.MustRegister(col)
//	c, err := omnibus.Open(ctx, url, omnibus.WithHooks(col))
//	http.Handle("/metrics", promhttp.Handler())
//
// Registered on a client (omnibus.WithHooks), the Collector counts its
// publishes and everything its consumers do; on one consumer
// (omnibus.Hooks), that consumer's. One Collector serves any number of
// clients and consumers. WatchGroup exports the lag of a group this
// process does not consume (the omnibus exporter command does that for
// any transport).
//
// # Metrics
//
// Every name starts with omnibus_; counters end in _total, durations are
// in seconds. Labels: transport (the URL scheme: kafka, amqp, nats, mem),
// topic, group, and lane (a partition, a shard, a queue) where a metric
// is per lane.
//
//	family                                 type       labels                       what
//	omnibus_published_messages_total       counter    transport topic              messages published
//	omnibus_publish_failed_messages_total  counter    transport topic              messages whose publish failed
//	omnibus_publish_duration_seconds       histogram  transport topic              Publish calls
//	omnibus_received_messages_total        counter    transport topic group        messages received from the transport
//	omnibus_received_bytes_total           counter    transport topic group        their bytes
//	omnibus_handled_messages_total         counter    transport topic group lane   messages handled, each attempt
//	omnibus_handler_errors_total           counter    transport topic group lane   attempts that failed (error or panic)
//	omnibus_handle_duration_seconds        histogram  transport topic group        handler run time, per message handled
//	omnibus_retries_total                  counter    transport topic group lane   retries scheduled
//	omnibus_dead_letters_total             counter    transport topic group lane   messages dead-lettered
//	omnibus_dead_letter_failures_total     counter    transport topic group lane   dead-letter publishes that failed
//	omnibus_lane_changes_total             counter    transport topic group change lanes claimed, revoked, lost
//	omnibus_members                        gauge      transport topic group        members the consumers run in this process
//	omnibus_in_flight_messages             gauge      transport topic group lane   received and not settled
//	omnibus_lag_messages                   gauge      transport topic group lane   the group's lag, as the transport counts it
//	omnibus_lag_seconds                    gauge      transport topic group lane   age of the oldest unsettled message
//	omnibus_lag_unknown_lanes              gauge      transport topic group        lanes whose lag could not be told
//	omnibus_lag_read_errors_total          counter    transport topic group        lag reads that failed at scrape time
//	omnibus_group_members                  gauge      transport topic group        members of the whole group (watched groups)
//
// The gauges are read at scrape time: members and in flight from each
// running consumer's Stats, lag from the transport (Consumer.Lag, or the
// watched group's read function), each read bounded by 5 s and all of
// them concurrently. A lane whose lag the transport cannot tell has no
// omnibus_lag_messages series (never 0) and counts in
// omnibus_lag_unknown_lanes; a failed read adds to
// omnibus_lag_read_errors_total. omnibus_lag_messages counts records on
// logs (Kafka, membus) and messages pending or unacknowledged on brokers
// (RabbitMQ queue depth, JetStream's pending and ack-pending).
// omnibus_lag_seconds has series where the transport reports the age of
// a lane's oldest message. Consumers of one topic and group in one
// process are summed into one series; a consumer that stopped is
// dropped.
//
// The handle duration is per topic and group, not per lane, which keeps
// its series few on topics of many partitions.
//
// # Cost
//
// Label sets are resolved once per consumer, topic and lane (see
// omnibus.HookBinder), so a handled message costs a few atomic adds and
// no allocation: BenchmarkHooks in the root package measures it in a
// running consumer, BenchmarkCollectorHook the collector's part alone.
//
// # Concurrency
//
// A Collector is safe for concurrent use; its hook methods run on the
// engine's goroutines, within the contract of omnibus.Hook.
package promomnibus

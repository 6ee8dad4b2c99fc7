//! The names of every metric podstream exports (Prometheus naming: `podstream_` prefix,
//! `_total` for counters, `_seconds` for durations), in one place for the code, the docs and
//! the dashboard, and the one metric polled rather than counted (a consumer's lag).
//! Recording goes through the `metrics` facade: nothing is kept unless the binary installed
//! an exporter (`--metrics-listen`).

/// Counter: pod events the ingest published and JetStream acked; label `type`
/// (`added`, `modified`, `deleted`) and `synthesized` (`true`, `false`).
pub const INGEST_EVENTS_PUBLISHED: &str = "podstream_ingest_events_published_total";
/// Counter: lists the ingest's watch completed (at start, and after each 410 or error).
pub const INGEST_LISTS: &str = "podstream_ingest_lists_total";
/// Counter: errors of the ingest's Kubernetes watch (each retried with backoff), other
/// than [`INGEST_WATCH_EXPIRED`].
pub const INGEST_WATCH_ERRORS: &str = "podstream_ingest_watch_errors_total";
/// Counter: watches the apiserver ended with 410 Gone (its history compacted past the
/// watch's revision); each is followed by a list.
pub const INGEST_WATCH_EXPIRED: &str = "podstream_ingest_watch_expired_total";
/// Gauge: 1 while this ingest holds the Lease (or runs without an election), else 0.
pub const INGEST_LEADER: &str = "podstream_ingest_leader";
/// Histogram: seconds from sending a pod event to JetStream's ack.
pub const INGEST_PUBLISH_ACK_SECONDS: &str = "podstream_ingest_publish_ack_seconds";
/// Counter: pod events the processor decided and acked.
pub const PROCESSOR_EVENTS_DECIDED: &str = "podstream_processor_events_decided_total";
/// Counter: commands the processor published; label `kind`.
pub const PROCESSOR_COMMANDS: &str = "podstream_processor_commands_total";
/// Counter: attempts to decide an event that failed and were retried.
pub const PROCESSOR_RETRIES: &str = "podstream_processor_retries_total";
/// Counter: pod events decided as foreign for want of a valid signature
/// (`--require-signed-pods`); label `reason` (`missing`, `malformed`, `mismatch`).
pub const PROCESSOR_UNSIGNED_EVENTS: &str = "podstream_processor_unsigned_events_total";
/// Counter: commands the sink finished; label `outcome` (`applied`, `skipped`, `dead`) and
/// `reason` (what was applied, why it was skipped).
pub const SINK_COMMANDS: &str = "podstream_sink_commands_total";
/// Histogram: seconds one batch of commands took in the database.
pub const SINK_BATCH_SECONDS: &str = "podstream_sink_batch_seconds";
/// Counter: batches the database failed as a whole (retried).
pub const SINK_BATCH_RETRIES: &str = "podstream_sink_batch_retries_total";
/// Counter: worker pods the collector deleted or labelled done (each once); label `reason`
/// (`finished`, `duplicate`, `stale`) and `action` (`deleted`, `labelled_done`).
pub const COLLECTOR_PODS: &str = "podstream_collector_pods_total";
/// Counter: dead letters stored; label `stage`.
pub const DEAD_LETTERS: &str = "podstream_dead_letters_total";
/// Gauge: 1 while a readiness condition of this process is met, else 0; label `condition`
/// (`watch_synced`, `consumer_bound`, `database_answers`), as `/readyz` reports them.
pub const READY: &str = "podstream_ready";
/// Gauge: messages of a stage's consumer not yet delivered; label `consumer`.
pub const CONSUMER_PENDING: &str = "podstream_consumer_pending";
/// Gauge: always 1; label `version`, the podstream release the process runs (which
/// versions a rollout has running, side by side).
pub const BUILD_INFO: &str = "podstream_build_info";

/// Every metric above, for the dashboard's and the docs' checks.
pub const ALL: [&str; 18] = [
    INGEST_EVENTS_PUBLISHED,
    INGEST_LISTS,
    INGEST_WATCH_ERRORS,
    INGEST_WATCH_EXPIRED,
    INGEST_LEADER,
    INGEST_PUBLISH_ACK_SECONDS,
    PROCESSOR_EVENTS_DECIDED,
    PROCESSOR_COMMANDS,
    PROCESSOR_RETRIES,
    PROCESSOR_UNSIGNED_EVENTS,
    SINK_COMMANDS,
    SINK_BATCH_SECONDS,
    SINK_BATCH_RETRIES,
    COLLECTOR_PODS,
    DEAD_LETTERS,
    READY,
    CONSUMER_PENDING,
    BUILD_INFO,
];

/// How often [`report_pending`] asks JetStream for the consumers' lag.
const PENDING_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Reports each consumer's undelivered messages as [`CONSUMER_PENDING`] every few seconds,
/// until the returned task is aborted. A failed query leaves the last value.
pub fn report_pending(
    consumers: Vec<async_nats::jetstream::consumer::PullConsumer>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut consumers = consumers;
        loop {
            for consumer in &mut consumers {
                if let Ok(info) = consumer.info().await {
                    let name = info.name.clone();
                    metrics::gauge!(CONSUMER_PENDING, "consumer" => name)
                        .set(info.num_pending as f64);
                }
            }
            tokio::time::sleep(PENDING_EVERY).await;
        }
    })
}

//! `podstream process`: pod events from JetStream → the rules → commands on JetStream.
//!
//! - **Work sharing and order.** One durable pull consumer per scheduler (`--scheduler 1,7`),
//!   or one on every owner. The consumer pins one instance at a time (JetStream priority
//!   group, `pinned_client`); other instances naming the same scheduler stand by and take over
//!   when the pinned one stops pulling (`failover`) or shuts down (it unpins). So a
//!   scheduler's events are decided in stream order: per pod, and across the pods of one task
//!   instance, which duplicate resolution needs (two pods of a TI decided by two instances at
//!   once could fail the TI on the loser's failure before the winner is known). Inside one
//!   instance, different task instances are decided concurrently (`--concurrency` at once),
//!   each as soon as it is free: one TI's events wait only for that TI (`TaskLanes`), and
//!   those that waited are decided together with one record write. Schedulers scale out.
//! - **State.** Nothing lives only in memory: each task instance has a KV record
//!   (`TaskRecord`) with its pods' states, written with compare-and-set. A lost race (two
//!   schedulers' consumers touching one TI, a takeover) reloads and decides again. The
//!   records an instance wrote last stay in a bounded cache (`RecordCache`) with their
//!   revisions, so a TI's next event needs no read. The TI of a pod the ingest says is new
//!   is taken to be new too, and its record created (compare-and-set on "no entry"), which
//!   fails, and reads, if it exists after all.
//! - **Per-pod order across consumers.** After a relabel a pod's events sit on two owners'
//!   subjects, pulled by two consumers. Before deciding an event at sequence `s`, the instance
//!   asks the stream for the pod's messages after the last one its record has decided (a
//!   wildcard lookup over every owner's subject of the pod) and decides any earlier one first;
//!   the instance that later receives an already decided event just acks it. The same covers
//!   the moment of a takeover, when the old instance may still hold unacked events. The
//!   lookup is skipped when the event itself says where the pod's previous event is
//!   (`previous_sequence`, from an ingest that knows) and that is the one the record last
//!   decided: nothing of the pod can lie between.
//! - **Crash recovery.** The consumer's ack wait is short (`--ack-wait-seconds`), so the events
//!   a crashed instance held are redelivered within seconds; a live instance keeps what it
//!   holds longer with progress acks (`InFlight`). A starting instance unpins the consumer
//!   and resets it to its ack floor, so a restart waits neither for the dead instance's pin
//!   nor for its events' ack wait. (The sink cannot: sinks share a consumer, and a reset
//!   would hand a live sink's commands to another while it applies them.)
//! - **Exactly once in effect.** Commands carry deterministic `Nats-Msg-Id`s and are stored in
//!   the record's outbox by the same write as the state; a pod event is acked only after its
//!   commands are acked.

mod consume;
mod start;
mod worker;

use std::future::Future;
use std::time::Duration;

use podstream_bus::BusConfig;
use podstream_bus::{Condition, Health};
use podstream_rules::Rules;
use tracing::info;

pub use crate::stats::ProcessStats;

/// How the processor runs.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// The NATS server, the subject prefix, the settings of the streams and the bucket.
    pub bus: BusConfig,
    /// Schedulers (owners) to process; empty means every owner.
    pub schedulers: Vec<String>,
    /// Durable consumer name, suffixed with the scheduler when `schedulers` is set.
    pub consumer: String,
    /// The KV bucket of task records.
    pub bucket: String,
    /// The rules.
    pub rules: Rules,
    /// Pod events fetched at once per consumer.
    pub batch_size: usize,
    /// Task instances decided at once (each as soon as it is free).
    pub concurrency: usize,
    /// How long a silent instance keeps its consumer before a standby takes over.
    pub failover: Duration,
    /// How long the consumer waits for an event's ack before redelivering it: how soon a
    /// crashed instance's events are decided again (held ones get progress acks).
    pub ack_wait: Duration,
    /// Task records kept in memory with their KV revisions (0: read each one from KV).
    pub cached_records: usize,
    /// The KV bucket of Spark records, when Spark driver pods are processed too
    /// (`--spark`, see [`crate::spark::service`]); `None` leaves them alone.
    pub spark_bucket: Option<String>,
    /// Readiness: the consumers bound, the last decision not failing.
    pub health: Health,
}

/// The processor's NATS client name: its replies come to `_INBOX_podstream-process`.
pub const CLIENT: &str = "podstream-process";

/// The streams the processor reads and writes, the pod events' first.
pub fn streams(config: &ProcessConfig) -> Vec<podstream_proto::subject::Stream> {
    use podstream_proto::subject::Stream;
    let mut streams = vec![Stream::PodEvents, Stream::Commands, Stream::DeadLetters];
    if config.spark_bucket.is_some() {
        streams.push(Stream::Spark);
    }
    streams
}

/// The durable consumer's name by default (and the bucket's).
pub const DEFAULT_CONSUMER: &str = "podstream-process";
/// Pod events fetched at once per consumer, by default.
pub const DEFAULT_BATCH_SIZE: usize = 256;
/// Task instances decided at once, by default.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Task records kept in memory, by default.
pub const DEFAULT_CACHED_RECORDS: usize = 8_192;

impl Default for ProcessConfig {
    fn default() -> Self {
        ProcessConfig {
            bus: BusConfig::default(),
            schedulers: Vec::new(),
            consumer: DEFAULT_CONSUMER.into(),
            bucket: podstream_bus::streams::DEFAULT_RECORDS_BUCKET.into(),
            rules: Rules::default(),
            batch_size: DEFAULT_BATCH_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            failover: Duration::from_secs(podstream_bus::config::DEFAULT_FAILOVER_SECONDS),
            ack_wait: podstream_bus::config::default_ack_wait(),
            cached_records: DEFAULT_CACHED_RECORDS,
            spark_bucket: None,
            health: Health::new(),
        }
    }
}

/// Why the processor did not start.
pub type ProcessError = podstream_bus::StageError;

/// Runs until `shutdown` resolves; the batches in hand are finished first.
pub async fn run(
    config: ProcessConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<ProcessStats, ProcessError> {
    config.health.declare(Condition::ConsumerBound);
    let started = start::start(&config).await?;
    let lag = podstream_bus::metrics::report_pending(started.consumers.clone());
    config.health.set(Condition::ConsumerBound, true);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = &started.worker;
    let loops = started
        .consumers
        .into_iter()
        .map(|consumer| worker.run_consumer(consumer, &config, stopped.clone()));
    let spark_loop = async {
        match &started.spark {
            Some(spark) => spark.run(stopped.clone()).await,
            None => ProcessStats::default(),
        }
    };
    let all = futures::future::join(futures::future::join_all(loops), spark_loop);
    tokio::pin!(all);
    tokio::pin!(shutdown);
    let (per_consumer, spark_stats) = tokio::select! {
        stats = &mut all => stats,
        _ = &mut shutdown => {
            let _ = stop.send(true);
            all.await
        }
    };
    lag.abort();
    let mut stats = spark_stats;
    for one in per_consumer {
        stats += one;
    }
    info!(%stats, "processor stopped");
    Ok(stats)
}

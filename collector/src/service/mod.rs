//! `podstream collect`: commands from JetStream → the collection rule → pods deleted on the
//! Kubernetes API.
//!
//! - **One active collector.** The consumer of every owner's commands is pinned to one
//!   instance at a time (the processors' priority group): a standby takes over when the
//!   pinned one stops pulling or lets go.
//! - **Judged on the record.** Each command says where to look ([`crate::rule::looks`]); the
//!   pods there are judged on the processor's record of their task instance as it is at that
//!   moment, read from the processor's KV bucket, so a pod that drives its try by then is
//!   kept.
//! - **A grace period without a timer.** A pod that must wait (a losing duplicate, a stale
//!   try's pod) sends its command back with a delay (a nak with the grace period left); it is
//!   judged again when it returns. Nothing is kept only in memory.
//! - **Once per pod.** Each pod collected is written to the collector's KV bucket
//!   (`<prefix>-collect`, by uid) after the API answered; a command naming it again (an
//!   outcome that followed its task to a new owner, a redelivery) finds it there and makes no
//!   second call. The command is acked after that.

mod handler;
mod start;

use std::future::Future;
use std::time::Duration;

use podstream_bus::BusConfig;
use podstream_bus::{Condition, Health};
use podstream_proto::subject::Stream;
use tracing::info;

use crate::rule::Settings;
pub use crate::stats::CollectStats;

/// How the collector runs.
#[derive(Debug, Clone)]
pub struct CollectConfig {
    /// The NATS server, the subject prefix, the settings of the streams and the buckets.
    pub bus: BusConfig,
    /// The durable consumer's name.
    pub consumer: String,
    /// The KV bucket of the pods collected.
    pub bucket: String,
    /// The processor's KV bucket of task records, read to judge each pod.
    pub records_bucket: String,
    /// What is collected, and when.
    pub settings: Settings,
    /// Commands handled at once.
    pub concurrency: usize,
    /// How long a silent instance keeps the consumer before a standby takes over.
    pub failover: Duration,
    /// How long the consumer waits for a command's ack before delivering it again.
    pub ack_wait: Duration,
    /// Readiness: the consumer bound.
    pub health: Health,
}

/// The collector's NATS client name.
pub const CLIENT: &str = "podstream-collect";
/// The streams the collector reads: the pod events' first (the records bucket is kept beside
/// it), then the commands it consumes and the dead letters it writes.
pub const STREAMS: [Stream; 3] = [Stream::PodEvents, Stream::Commands, Stream::DeadLetters];
/// The durable consumer's name by default.
pub const DEFAULT_CONSUMER: &str = "podstream-collect";
/// The KV bucket of pods collected by default.
pub const DEFAULT_BUCKET: &str = "podstream-collect";
pub use crate::collected::BUCKET_ROLE;
/// Commands handled at once, by default.
pub const DEFAULT_CONCURRENCY: usize = 16;

impl Default for CollectConfig {
    fn default() -> Self {
        CollectConfig {
            bus: BusConfig::default(),
            consumer: DEFAULT_CONSUMER.into(),
            bucket: DEFAULT_BUCKET.into(),
            records_bucket: podstream_bus::streams::DEFAULT_RECORDS_BUCKET.into(),
            settings: Settings::default(),
            concurrency: DEFAULT_CONCURRENCY,
            failover: Duration::from_secs(podstream_bus::config::DEFAULT_FAILOVER_SECONDS),
            ack_wait: podstream_bus::config::default_ack_wait(),
            health: Health::new(),
        }
    }
}

/// Why the collector did not start.
pub type CollectError = podstream_bus::StageError;

/// Runs until `shutdown` resolves; the commands in hand are finished first.
pub async fn run(
    config: CollectConfig,
    kube: kube::Client,
    shutdown: impl Future<Output = ()>,
) -> Result<CollectStats, CollectError> {
    config.health.declare(Condition::ConsumerBound);
    let started = start::start(&config).await?;
    let lag = podstream_bus::metrics::report_pending(vec![started.consumer.clone()]);
    config.health.set(Condition::ConsumerBound, true);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let collecting = handler::run(started, kube, &config, stopped);
    tokio::pin!(collecting);
    tokio::pin!(shutdown);
    let stats = tokio::select! {
        stats = &mut collecting => stats,
        _ = &mut shutdown => {
            let _ = stop.send(true);
            collecting.await
        }
    };
    lag.abort();
    info!(%stats, "collector stopped");
    Ok(stats)
}

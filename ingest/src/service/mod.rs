//! `podstream ingest`: watch every worker pod, publish each event once, checkpoint, repeat.
//!
//! Start (`start.rs`): connect to NATS (retrying), make the streams and the checkpoint bucket
//! ready, wait to lead (see [`crate::leadership`]), claim and load the checkpoint. Then
//! kube-runtime's `watcher` lists and watches (`watch.rs`), each pod projected as it is read
//! to its event or its dead letter (`projected.rs`). Every list (the first, and one
//! after each 410) is held back until it is complete, and then (`publishing.rs`):
//! 1. if the ingest knows a revision it had reached (from the checkpoint, or its own watch),
//!    the apiserver's history since that revision is replayed with a short watch, so changes
//!    made while nobody watched arrive one by one, in order (a 410 skips this step);
//! 2. the listed pods follow: those at a revision already published are skipped, newer ones
//!    are published (changes whose history was gone arrive collapsed into their last state);
//! 3. pods the ingest knew that were neither listed nor replayed vanished unseen: each gets a
//!    synthesized delete.

mod projected;
mod publishing;
mod start;
mod watch;

use std::future::Future;
use std::time::Duration;

use podstream_bus::BusConfig;
use podstream_bus::{Condition, Health};

use crate::leadership::{Deposed, Leadership, LeaseConfig};
use crate::projection::OWNER_LABEL;
use crate::spark::SparkWatches;
use watch::{PodWatches, READ_AHEAD};

/// How often acks that arrived while nothing was published are collected.
const ACK_POLL: Duration = Duration::from_millis(50);

/// How the ingest runs.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// The NATS server, the subject prefix, the settings of the streams it creates.
    pub bus: BusConfig,
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// The kubeconfig context, when not the current one.
    pub kube_context: Option<String>,
    /// A label selector narrowing the watch to one Airflow deployment's worker pods
    /// (`--pod-selector`); `None` watches every worker pod.
    pub pod_selector: Option<String>,
    /// Publishes awaiting their ack at most.
    pub ack_window: usize,
    /// The checkpoint KV bucket.
    pub checkpoint_bucket: String,
    /// How often the checkpoint is written at most (see [`crate::checkpoint`]).
    pub checkpoint_interval: Duration,
    /// The Lease that elects one ingest among replicas; `None` runs without an election
    /// (one ingest per cluster, or the demo).
    pub lease: Option<LeaseConfig>,
    /// Also watch the driver pods of Airflow's Spark jobs and their SparkApplications
    /// (`--spark`, see [`crate::spark`]).
    pub spark: bool,
    /// Readiness: the watch synced (or standing by to lead).
    pub health: Health,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            bus: BusConfig::default(),
            namespaces: Vec::new(),
            kube_context: None,
            pod_selector: None,
            ack_window: DEFAULT_ACK_WINDOW,
            checkpoint_bucket: DEFAULT_CHECKPOINT_BUCKET.into(),
            checkpoint_interval: Duration::from_millis(DEFAULT_CHECKPOINT_INTERVAL_MS),
            lease: None,
            spark: false,
            health: Health::new(),
        }
    }
}

/// Publishes awaiting their ack at most, by default.
pub const DEFAULT_ACK_WINDOW: usize = 1024;
/// The ingest's NATS client name: its replies come to `_INBOX_podstream-ingest`.
pub const CLIENT: &str = "podstream-ingest";

/// The streams the ingest writes, the pod events' first.
pub fn streams(config: &IngestConfig) -> Vec<podstream_proto::subject::Stream> {
    use podstream_proto::subject::Stream;
    let mut streams = vec![Stream::PodEvents, Stream::DeadLetters];
    if config.spark {
        streams.push(Stream::Spark);
    }
    streams
}

/// The checkpoint KV bucket by default.
pub const DEFAULT_CHECKPOINT_BUCKET: &str = "podstream-ingest";
/// The role in the name of a prefix's checkpoint bucket (`<prefix>-ingest`).
pub const CHECKPOINT_ROLE: &str = "ingest";
/// How often the checkpoint is written at most, by default, in milliseconds.
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 1000;

/// Counters the ingest reports when it stops.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IngestStats {
    /// Pod events and owner notices acked.
    pub published: u64,
    /// Spark objects' events acked (`--spark`), synthesized deletes among them.
    pub spark: u64,
    /// Synthesized deletes among them.
    pub synthesized: u64,
    /// Dead letters acked.
    pub dead_lettered: u64,
    /// Watch events skipped because their revision was published already.
    pub skipped: u64,
}

impl std::fmt::Display for IngestStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} published ({} synthesized deletes), ",
            self.published, self.synthesized
        )?;
        if self.spark > 0 {
            write!(f, "{} Spark events, ", self.spark)?;
        }
        write!(f, "{} dead-lettered", self.dead_lettered)
    }
}

/// Why no Kubernetes client could be made.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    /// No configuration was found.
    #[error("no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)")]
    Infer(#[source] kube::config::InferConfigError),
    /// The context asked for does not load.
    #[error("kubeconfig context {context}")]
    Context {
        /// The context.
        context: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from the configuration.
    #[error("building the Kubernetes client")]
    Build(#[source] kube::Error),
}

impl podstream_bus::fault::Classified for KubeClientError {
    fn fault(&self) -> podstream_bus::fault::Fault {
        podstream_bus::fault::Fault::Configuration
    }
}

/// A Kubernetes client inferred like kubectl (`KUBECONFIG`, `~/.kube/config`, in-cluster),
/// with another context when asked.
pub async fn kube_client(context: Option<&str>) -> Result<kube::Client, KubeClientError> {
    let config = match context {
        None => kube::Config::infer()
            .await
            .map_err(KubeClientError::Infer)?,
        Some(context) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(context.to_owned()),
                ..Default::default()
            };
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|source| KubeClientError::Context {
                    context: context.to_owned(),
                    source,
                })?
        }
    };
    kube::Client::try_from(config).map_err(KubeClientError::Build)
}

/// Why the ingest did not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Its Role lacks permissions its calls need (each one named).
    #[error(transparent)]
    Forbidden(#[from] crate::access::Forbidden),
    /// The checkpoint would be written too rarely for the duplicate window to cover a crash.
    #[error(
        "the checkpoint interval ({interval:?}) must be under half the duplicate window ({window:?})"
    )]
    Window {
        /// `--checkpoint-interval-ms`.
        interval: Duration,
        /// The pod-events stream's duplicate window.
        window: Duration,
    },
    /// Connecting to NATS or making the streams ready failed.
    #[error("starting on the bus")]
    Bus(#[from] podstream_bus::StartError),
    /// It could not come to lead.
    #[error(transparent)]
    Lease(#[from] crate::leadership::LeaseError),
    /// Its checkpoint could not be opened, claimed, read or written.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Another ingest leads now: this one may write nothing more.
    #[error(transparent)]
    Deposed(#[from] Deposed),
}

impl podstream_bus::fault::Classified for IngestError {
    fn fault(&self) -> podstream_bus::fault::Fault {
        use podstream_bus::fault::Fault;
        match self {
            IngestError::Forbidden(_) | IngestError::Window { .. } => Fault::Configuration,
            IngestError::Bus(error) => error.fault(),
            IngestError::Lease(_) | IngestError::Checkpoint(_) | IngestError::Deposed(_) => {
                Fault::Other
            }
        }
    }
}

/// The label selector of the worker-pod watch: every pod with the owner label, whoever owns
/// it (any value), narrowed by `--pod-selector` to one Airflow deployment's pods.
pub fn worker_selector(pod_selector: Option<&str>) -> String {
    match pod_selector.map(str::trim).filter(|s| !s.is_empty()) {
        Some(narrower) => format!("{OWNER_LABEL},{narrower}"),
        None => OWNER_LABEL.to_owned(),
    }
}

/// Runs until `shutdown` resolves, then drains in-flight acks and the checkpoint.
pub async fn run(
    config: IngestConfig,
    kube: kube::Client,
    shutdown: impl Future<Output = ()>,
) -> Result<IngestStats, IngestError> {
    config.health.declare(Condition::WatchSynced);
    metrics::gauge!(podstream_bus::metrics::INGEST_LEADER).set(0.0);
    tokio::pin!(shutdown);
    let Some(start::Started {
        mut ingest,
        mut leadership,
    }) = start::start(&config, &kube, &mut shutdown).await?
    else {
        return Ok(IngestStats::default());
    };
    let subjects = ingest.subjects.clone();
    let mut pods = PodWatches::start(
        &kube,
        &config.namespaces,
        subjects.clone(),
        &ingest.selector,
    );
    let mut spark = if config.spark {
        SparkWatches::start(&kube, &config.namespaces, subjects, READ_AHEAD)
    } else {
        SparkWatches::none()
    };
    let mut tick = tokio::time::interval(ACK_POLL);
    loop {
        if let Some(deposed) = ingest.deposed() {
            // Written nothing since the fence closed; exiting makes this a fresh standby.
            return Err(deposed.into());
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = lost(&mut leadership) => {
                return Err(Deposed("the lease was lost to another ingest".into()).into());
            }
            _ = tick.tick() => ingest.checkpoint_acked().await,
            Some((index, item)) = spark.next() => {
                if let Some((scope, action)) = spark.step(index, item) {
                    ingest.on_spark(scope, action).await;
                }
            }
            item = pods.recv() => {
                let Some(first) = item else { break };
                pods.on_burst(first, &mut ingest, &config.health).await;
            }
        }
    }
    let stats = ingest.stop().await;
    if let Some(leadership) = leadership {
        leadership.release().await;
    }
    Ok(stats?)
}

/// Resolves when a held lease is lost; never without an election.
async fn lost(leadership: &mut Option<Leadership>) {
    match leadership {
        Some(leadership) => leadership.lost().await,
        None => std::future::pending().await,
    }
}

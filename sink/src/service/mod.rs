//! `podstream sink`: a durable pull consumer on the commands stream. Commands go to lanes, one
//! per database connection and each TI always in the same one (see [`crate::lanes`]); a
//! lane's batch is applied in one transaction and acked only after the commit. Several sinks
//! may share the consumer. A connection problem retries the batch (nothing was committed); a
//! command the database refuses goes to `podstream.dead.sink` and the rest of the batch applies.
//!
//! The consumer's ack wait is short (`--ack-wait-seconds`), so what a crashed sink held is
//! applied by the next within seconds; a live sink keeps every command it holds with progress
//! acks until its batch commits ([`InFlight`]).
mod receive;
mod report;
mod start;

use std::future::Future;
use std::time::Duration;

use podstream_bus::BusConfig;
use podstream_bus::consume::{ConsumerLoop, DeadLetters, Pulling, Sharing};
use podstream_bus::in_flight::InFlight;
use podstream_bus::{Condition, Health};
use podstream_proto::subject::Stage;

use crate::db::Database;
use crate::lanes::{LaneConfig, Lanes};
use crate::summary::Summary;

pub use start::StartError;

/// Lanes (parallel transactions) by default: one more than the cores of a small database
/// server, so the server has work while a lane is between statements (BENCHMARKS.md).
pub const DEFAULT_CONNECTIONS: usize = 3;
/// The durable consumer's name by default; sinks with the same name share the work.
pub const DEFAULT_CONSUMER: &str = "podstream-sink";
/// The sink's NATS client name: its replies come to `_INBOX_podstream-sink`.
pub const CLIENT: &str = "podstream-sink";
/// The streams the sink reads and writes, the commands' first.
pub const STREAMS: [podstream_proto::subject::Stream; 2] = [
    podstream_proto::subject::Stream::Commands,
    podstream_proto::subject::Stream::DeadLetters,
];
/// Commands per transaction at most, by default.
pub const DEFAULT_BATCH_SIZE: usize = 500;
/// Milliseconds a batch smaller than the batch size waits for more, by default.
pub const DEFAULT_BATCH_WAIT_MS: u64 = 0;

/// How the sink runs.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// The NATS server, the subject prefix, the settings of the streams it makes sure of.
    pub bus: BusConfig,
    /// Durable consumer name; sinks with the same name share the work.
    pub consumer: String,
    /// Commands per transaction at most.
    pub batch_size: usize,
    /// How long a batch smaller than `batch_size` waits for more (zero: not at all).
    pub batch_wait: Duration,
    /// Lanes on PostgreSQL, each a transaction at a time, commands routed by TI (SQLite: one).
    pub connections: usize,
    /// How long the consumer waits for a command's ack before redelivering it: how soon a
    /// crashed sink's commands are applied by another (held ones get progress acks).
    pub ack_wait: Duration,
    /// How long `podstream_applied` keeps command ids, as `--applied-retention-hours`:
    /// `None` the commands stream's max age plus a day, zero forever; checked against the
    /// stream's actual max age at start ([`crate::retention::applied_retention`]).
    pub applied_retention: Option<Duration>,
    /// Readiness: the consumer bound, the database answering.
    pub health: Health,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            bus: BusConfig::default(),
            consumer: DEFAULT_CONSUMER.into(),
            batch_size: DEFAULT_BATCH_SIZE,
            batch_wait: Duration::from_millis(DEFAULT_BATCH_WAIT_MS),
            connections: DEFAULT_CONNECTIONS,
            ack_wait: podstream_bus::config::default_ack_wait(),
            applied_retention: None,
            health: Health::new(),
        }
    }
}

/// The consumer metadata key in which every consumer of the commands stream that acts on
/// failures says who fails task instances: `sink` or `executor` (podstream-airflow's
/// executors write `executor`).
pub const TASK_FAILURES_METADATA: &str = "podstream.task_failures";

/// Why the sink stopped or did not start.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Connecting to NATS or making the streams ready failed.
    #[error("starting on the bus")]
    Bus(#[from] podstream_bus::StartError),
    /// `--applied-retention-hours` is shorter than the commands stream keeps commands.
    #[error(transparent)]
    Retention(#[from] crate::retention::RetentionTooShort),
    /// The commands stream could not be opened.
    #[error("opening the commands stream")]
    Stream(#[source] async_nats::jetstream::context::GetStreamError),
    /// The consumers of the commands stream could not be listed.
    #[error("listing the consumers of the commands stream")]
    Consumers(#[source] async_nats::jetstream::stream::ConsumersError),
    /// Another consumer says another party fails task instances.
    #[error(transparent)]
    Refused(#[from] StartError),
    /// The durable consumer could not be created or updated.
    #[error("creating the sink consumer")]
    Consumer(#[source] async_nats::jetstream::stream::ConsumerError),
    /// The lanes stopped taking commands.
    #[error("handing commands to the database")]
    Lanes(#[from] podstream_bus::consume::HandlerStopped),
}

impl podstream_bus::fault::Classified for SinkError {
    fn fault(&self) -> podstream_bus::fault::Fault {
        use podstream_bus::fault::Fault;
        match self {
            SinkError::Bus(error) => error.fault(),
            SinkError::Retention(_) | SinkError::Refused(_) => Fault::Configuration,
            SinkError::Stream(_)
            | SinkError::Consumers(_)
            | SinkError::Consumer(_)
            | SinkError::Lanes(_) => Fault::Other,
        }
    }
}

/// Runs until `shutdown` resolves; what the lanes hold is applied and acked first.
pub async fn run(
    config: SinkConfig,
    db: Database,
    shutdown: impl Future<Output = ()>,
) -> Result<Summary, SinkError> {
    config.health.declare(Condition::ConsumerBound);
    config.health.declare(Condition::DatabaseAnswers);
    // Connected and checked before the sink runs: a refusal from now on flips it.
    config.health.set(Condition::DatabaseAnswers, true);
    let start::Started {
        js,
        subjects,
        consumer,
        applied_retention,
    } = start::start(&config, &db).await?;
    let lag = podstream_bus::metrics::report_pending(vec![consumer.clone()]);
    let pruner =
        applied_retention.map(|retention| tokio::spawn(db.clone().prune_periodically(retention)));
    let (lanes, applied) = Lanes::start(
        &db,
        LaneConfig {
            lanes: config.connections,
            batch_size: config.batch_size,
            batch_wait: config.batch_wait,
            health: config.health.clone(),
        },
    );
    // A continuous pull, handed to the lanes as it arrives: a quiet stream commits each
    // command at once, a busy one fills each lane's next batch while its previous one commits.
    // Every command pulled is held, with progress acks, until its batch commits: a slow
    // database keeps its commands rather than seeing them redelivered.
    let dead = DeadLetters {
        js: js.clone(),
        subjects,
        stage: Stage::Sink,
    };
    let consumer = ConsumerLoop {
        consumer,
        sharing: Sharing::Shared,
        pulling: Pulling {
            batch_size: config.batch_size,
            in_flight: InFlight::start(js.client(), config.ack_wait),
            health: config.health.clone(),
        },
        dead: dead.clone(),
    };
    let mut handler = receive::CommandHandler {
        lanes: Some(lanes),
        applied,
        dead,
        summary: Summary::default(),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let consumed = {
        let running = consumer.run(&mut handler, stopped);
        tokio::pin!(running);
        tokio::pin!(shutdown);
        tokio::select! {
            consumed = &mut running => consumed,
            _ = &mut shutdown => {
                let _ = stop.send(true);
                running.await
            }
        }
    };
    lag.abort();
    if let Some(pruner) = pruner {
        pruner.abort();
    }
    let mut summary = handler.summary;
    summary.dead_lettered += consumed?.dead_lettered;
    tracing::info!(%summary, "sink stopped");
    Ok(summary)
}

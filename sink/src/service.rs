//! `podstream sink`: a durable pull consumer on the commands stream. Commands go to lanes, one
//! per database connection and each TI always in the same one (see [`crate::lanes`]); a
//! lane's batch is applied in one transaction and acked only after the commit. Several sinks
//! may share the consumer. A connection problem retries the batch (nothing was committed); a
//! command the database refuses goes to `podstream.dead.sink` and the rest of the batch applies.
//!
//! The consumer's ack wait is short (`--ack-wait-seconds`), so what a crashed sink held is
//! applied by the next within seconds; a live sink keeps every command it holds with progress
//! acks until its batch commits ([`InFlight`]).
use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures::{StreamExt, TryStreamExt};
use podstream_bus::Backoff;
use podstream_bus::BusConfig;
use podstream_bus::dead::DeadLetter;
use podstream_bus::in_flight::{Held, InFlight, Inbox};
use podstream_bus::streams;
use podstream_bus::{Condition, Health};
use podstream_proto::Command;
use podstream_proto::subject::{Stage, Stream, Subjects};
use prost::Message as _;

use crate::db::Database;
use crate::guard::{Skip, TaskFailures};
use crate::item::{Item, Outcome};
use crate::lanes::{Applied, LaneConfig, Lanes};
use crate::summary::Summary;

/// Lanes (parallel transactions) by default: one more than the cores of a small database
/// server, so the server has work while a lane is between statements (BENCHMARKS.md).
pub const DEFAULT_CONNECTIONS: usize = 3;
/// The durable consumer's name by default; sinks with the same name share the work.
pub const DEFAULT_CONSUMER: &str = "podstream-sink";
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

/// Why the sink does not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another consumer of the commands stream says another party fails task instances.
    #[error(
        "consumer {consumer} on {stream} says task failures belong to the {theirs}, and this sink would fail task instances as the {ours}: a failure would be applied twice. Start the sink with --task-failures {theirs}, or remove that consumer (`nats consumer rm {stream} {consumer}`) if nothing uses it any more"
    )]
    SecondFailureOwner {
        /// The other consumer.
        consumer: String,
        /// The stream.
        stream: String,
        /// What it says.
        theirs: String,
        /// What this sink would do.
        ours: &'static str,
    },
}

/// Refuses to start when a consumer other than `own` declares another owner of task failures.
async fn refuse_a_second_failure_owner(
    stream: &jetstream::stream::Stream,
    own: &str,
    ours: TaskFailures,
) -> anyhow::Result<()> {
    let mut consumers = stream.consumers();
    while let Some(info) = consumers
        .try_next()
        .await
        .context("listing the consumers of the commands stream")?
    {
        let theirs = info.config.metadata.get(TASK_FAILURES_METADATA);
        if info.name != own
            && let Some(theirs) = theirs
            && theirs != ours.name()
        {
            return Err(StartError::SecondFailureOwner {
                consumer: info.name.clone(),
                stream: info.stream_name.clone(),
                theirs: theirs.clone(),
                ours: ours.name(),
            }
            .into());
        }
    }
    Ok(())
}

/// Runs until `shutdown` resolves; what the lanes hold is applied and acked first.
pub async fn run(
    config: SinkConfig,
    db: Database,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Summary> {
    let subjects = config.bus.subjects().context("invalid --prefix")?;
    config.health.declare(Condition::ConsumerBound);
    config.health.declare(Condition::DatabaseAnswers);
    // Connected and checked before the sink runs: a refusal from now on flips it.
    config.health.set(Condition::DatabaseAnswers, true);
    let nats = podstream_bus::connect(&config.bus.nats_url, &config.bus.security, "podstream-sink")
        .await?;
    let js = jetstream::new(nats);
    let commands = streams::ensure(
        &js,
        streams::stream_config(&subjects, Stream::Commands, &config.bus.streams),
    )
    .await?;
    // Ids are kept at least as long as the stream as it is keeps commands, whoever set it.
    let applied_retention =
        crate::retention::applied_retention(config.applied_retention, commands.max_age)?;
    streams::ensure(
        &js,
        streams::stream_config(&subjects, Stream::DeadLetters, &config.bus.streams),
    )
    .await?;
    let stream = streams::while_unavailable(&commands.name, || js.get_stream(&commands.name))
        .await
        .context("opening the commands stream")?;
    let task_failures = db.policy.task_failures;
    refuse_a_second_failure_owner(&stream, &config.consumer, task_failures).await?;
    // Created or updated: the consumer declares who fails TIs, for the executors to check.
    let wanted = pull::Config {
        durable_name: Some(config.consumer.clone()),
        filter_subject: subjects.commands_filter(None),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: config.ack_wait,
        // Also what one sink may hold: its inbox reads ahead of the lanes.
        max_ack_pending: 20_000,
        metadata: [(
            TASK_FAILURES_METADATA.to_owned(),
            task_failures.name().to_owned(),
        )]
        .into(),
        ..Default::default()
    };
    let consumer =
        streams::while_unavailable(&config.consumer, || stream.create_consumer(wanted.clone()))
            .await
            .context("creating the sink consumer")?;
    let lag = podstream_bus::metrics::report_pending(vec![consumer.clone()]);
    let pruner =
        applied_retention.map(|retention| tokio::spawn(db.clone().prune_periodically(retention)));
    let mut summary = Summary::default();
    tokio::pin!(shutdown);
    let (lanes, mut applied) = Lanes::start(
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
    let in_flight = InFlight::start(js.client(), config.ack_wait);
    let mut chunks = pull_stream(&consumer, config.batch_size, &in_flight, &config.health).await;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(batch) = applied.recv() => finish(&js, &subjects, batch, &mut summary).await,
            chunk = chunks.next() => {
                let Some(chunk) = chunk else {
                    tracing::warn!("the pull stream ended; pulling again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    chunks = pull_stream(&consumer, config.batch_size, &in_flight, &config.health).await;
                    continue;
                };
                for message in chunk {
                    let message = match message {
                        Ok(message) => message,
                        Err(error) => {
                            tracing::warn!(%error, "receiving a command failed");
                            continue;
                        }
                    };
                    if podstream_bus::role::is_left_notice(message.headers.as_ref()) {
                        // The previous owner's copy of a transfer: applied from the other.
                        ack(&message).await;
                        continue;
                    }
                    let sequence = message.info().map(|i| i.stream_sequence).ok();
                    match Command::decode(message.payload.as_ref()) {
                        Ok(command) => lanes
                            .send(Item { command, sequence }, message)
                            .await
                            .context("handing a command to the database")?,
                        Err(error) => {
                            let reason = format!("not a Command: {error}");
                            dead_letter(&js, &subjects, &message, &reason).await;
                            summary.dead_lettered += 1;
                            ack(&message).await;
                        }
                    }
                }
            }
        }
    }
    // Everything handed to a lane is applied and acked before the sink stops: the applied
    // batches end when the last lane has finished.
    let closing = tokio::spawn(lanes.close());
    while let Some(batch) = applied.recv().await {
        finish(&js, &subjects, batch, &mut summary).await;
    }
    if let Err(panic) = closing.await {
        tracing::error!(%panic, "closing the sink lanes panicked");
    }
    lag.abort();
    if let Some(pruner) = pruner {
        pruner.abort();
    }
    tracing::info!(%summary, "sink stopped");
    Ok(summary)
}

/// What happens to each command once its lane has committed: dead letter, log, count, ack.
async fn finish(
    js: &jetstream::Context,
    subjects: &Subjects,
    batch: Applied<Held>,
    summary: &mut Summary,
) {
    for (item, message, outcome) in batch {
        if let Outcome::Dead(reason) = &outcome {
            tracing::warn!(command = %item.command.id, %reason, "command dead-lettered");
            dead_letter(js, subjects, &message, reason).await;
        } else {
            log_outcome(&item.command, &outcome);
        }
        summary.add(&outcome);
        ack(&message).await;
    }
}

type Chunks = futures::stream::ReadyChunks<Inbox>;

/// The consumer's messages in chunks of what has arrived, each held from its arrival,
/// retrying until the pull starts.
async fn pull_stream(
    consumer: &jetstream::consumer::PullConsumer,
    batch_size: usize,
    in_flight: &InFlight,
    health: &Health,
) -> Chunks {
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
    loop {
        match consumer
            .stream()
            .max_messages_per_batch(batch_size)
            .messages()
            .await
        {
            Ok(messages) => {
                health.set(Condition::ConsumerBound, true);
                return in_flight.receive(messages).ready_chunks(batch_size.max(1));
            }
            Err(error) => {
                health.set(Condition::ConsumerBound, false);
                tracing::warn!(%error, "pulling commands failed; retrying");
                backoff.wait().await;
            }
        }
    }
}

async fn ack(message: &jetstream::Message) {
    if let Err(error) = message.ack_with(AckKind::Ack).await {
        // Unacked means redelivered; the applied-command record makes that harmless.
        tracing::warn!(%error, "ack failed; the command will be redelivered and skipped");
    }
}

async fn dead_letter(
    js: &jetstream::Context,
    subjects: &Subjects,
    message: &jetstream::Message,
    reason: &str,
) {
    let dead = DeadLetter::of_message(subjects, Stage::Sink, message, reason.to_owned());
    podstream_bus::dead::store(js, &dead).await;
}

fn log_outcome(command: &Command, outcome: &Outcome) {
    let task = command
        .task
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let pod = command
        .pod
        .as_ref()
        .map(|p| p.name.as_str())
        .unwrap_or_default();
    let (label, reason) = match outcome {
        Outcome::Applied(what) => ("applied", what.name()),
        Outcome::Skipped(skip) => ("skipped", skip.name()),
        Outcome::Dead(_) => ("dead", "refused"),
    };
    metrics::counter!(podstream_bus::metrics::SINK_COMMANDS, "outcome" => label, "reason" => reason)
        .increment(1);
    match outcome {
        Outcome::Applied(what) => {
            tracing::info!(ti = %task, pod, owner = %command.owner, command = %command.id, what = what.name(), "applied")
        }
        // A pod that is not its TI's is someone's copy of the TI's annotations: worth a look.
        Outcome::Skipped(skip @ Skip::ForeignPod) => {
            tracing::warn!(ti = %task, pod, owner = %command.owner, command = %command.id, reason = skip.name(), "skipped: the pod is not this task instance's")
        }
        Outcome::Skipped(skip) => {
            tracing::debug!(ti = %task, pod, owner = %command.owner, command = %command.id, reason = skip.name(), "skipped")
        }
        Outcome::Dead(_) => {}
    }
}

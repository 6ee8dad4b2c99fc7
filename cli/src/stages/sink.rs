//! `podstream sink`: commands from JetStream applied to the metadata DB (docs/contract.md §3).

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use podstream_sink::Database;
use podstream_sink::service::{self, SinkConfig};

use crate::args::db::DbArgs;
use crate::args::retention::RetentionArgs;
use crate::args::stream::{AckWaitArgs, NatsArgs, StreamArgs};

/// Flags of `podstream sink`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  PODSTREAM_DB_PASSWORD=... podstream sink --nats nats://127.0.0.1:4222 --db postgres://airflow@db:5432/airflow"
)]
pub struct SinkArgs {
    #[command(flatten)]
    pub(crate) nats: NatsArgs,
    #[command(flatten)]
    ops: crate::args::ops::OpsArgs,
    #[command(flatten)]
    pub(crate) streams: StreamArgs,
    #[command(flatten)]
    pub(crate) db: DbArgs,
    /// Durable consumer name; sinks with the same name share the commands.
    #[arg(
        long,
        env = "PODSTREAM_SINK_CONSUMER",
        default_value = service::DEFAULT_CONSUMER
    )]
    consumer: String,
    #[command(flatten)]
    batching: SinkBatchArgs,
    #[command(flatten)]
    ack_wait: AckWaitArgs,
    #[command(flatten)]
    shutdown: crate::signal::ShutdownArgs,
    #[command(flatten)]
    retention: RetentionArgs,
}

/// How the sink batches its transactions: flags of `podstream sink` and `podstream run`.
#[derive(Debug, Clone, Args)]
pub struct SinkBatchArgs {
    /// Commands per transaction at most.
    #[arg(long, env = "PODSTREAM_BATCH_SIZE", default_value_t = service::DEFAULT_BATCH_SIZE)]
    batch_size: usize,
    /// Milliseconds a batch smaller than --batch-size waits for more (0: commit what has arrived).
    #[arg(long, env = "PODSTREAM_BATCH_WAIT_MS", default_value_t = service::DEFAULT_BATCH_WAIT_MS)]
    batch_wait_ms: u64,
    /// Lanes on PostgreSQL: each commits its own batches on its own connection, and a task
    /// instance always goes to the same lane (its commands stay in order). SQLite uses one.
    #[arg(long, env = "PODSTREAM_SINK_CONNECTIONS", default_value_t = service::DEFAULT_CONNECTIONS)]
    connections: usize,
}

impl SinkBatchArgs {
    /// `config` batching as these flags say.
    pub fn batching(&self, config: SinkConfig) -> SinkConfig {
        SinkConfig {
            batch_size: self.batch_size,
            batch_wait: Duration::from_millis(self.batch_wait_ms),
            connections: self.connections,
            ..config
        }
    }
}

/// Runs until SIGINT/SIGTERM.
pub fn run(args: &SinkArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    let bus = args
        .streams
        .bus(args.nats.url(), args.nats.security.security());
    runtime.block_on(async {
        let health = args.ops.serve().await?;
        // Not ready until the database answers.
        health.declare(podstream_bus::Condition::DatabaseAnswers);
        let db = Database::connect_to(&args.db.target()?)
            .await?
            .with_policy(args.db.policy());
        let config = args.batching.batching(SinkConfig {
            bus,
            consumer: args.consumer.clone(),
            ack_wait: args.ack_wait.ack_wait(),
            applied_retention: args.retention.applied_retention_hours,
            health,
            ..SinkConfig::default()
        });
        let summary = args
            .shutdown
            .run(|shutdown| service::run(config, db, shutdown))
            .await?;
        eprintln!("sink stopped: {summary}");
        Ok(())
    })
}

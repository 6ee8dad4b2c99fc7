//! `podstream process`: pod events → the rules → commands, with state in JetStream KV.

use anyhow::Context;
use clap::Args;
use podstream_processor::service::{self, ProcessConfig};

use crate::args::stream::{AckWaitArgs, NatsArgs, StreamArgs};
use crate::offline::decide::RulesArgs;

/// Flags of `podstream process`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  podstream process --nats nats://127.0.0.1:4222\n  podstream process --nats nats://nats:4222 --scheduler 1,7    # only these schedulers' pods"
)]
pub struct ProcessArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub ops: crate::args::ops::OpsArgs,
    #[command(flatten)]
    pub streams: StreamArgs,
    /// Schedulers (`airflow-worker` values) to process, comma-separated; every scheduler when
    /// empty. Instances naming the same scheduler share its work.
    #[arg(long, env = "PODSTREAM_SCHEDULERS", value_delimiter = ',')]
    pub scheduler: Vec<String>,
    /// Durable consumer name (suffixed `-<scheduler>` with --scheduler).
    #[arg(
        long,
        env = "PODSTREAM_PROCESS_CONSUMER",
        default_value = service::DEFAULT_CONSUMER
    )]
    pub consumer: String,
    /// KV bucket of the per-task-instance state [default: <prefix>-process].
    #[arg(long, env = "PODSTREAM_PROCESS_BUCKET")]
    pub bucket: Option<String>,
    /// Pod events fetched at once.
    #[arg(long, env = "PODSTREAM_PROCESS_BATCH_SIZE", default_value_t = service::DEFAULT_BATCH_SIZE)]
    pub batch_size: usize,
    /// Task instances decided concurrently.
    #[arg(long, env = "PODSTREAM_PROCESS_CONCURRENCY", default_value_t = service::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Seconds a silent instance keeps its consumer before a standby instance takes over.
    #[arg(long, env = "PODSTREAM_FAILOVER_SECONDS", default_value_t = podstream_bus::config::DEFAULT_FAILOVER_SECONDS)]
    pub failover_seconds: u64,
    #[command(flatten)]
    pub ack_wait: AckWaitArgs,
    #[command(flatten)]
    pub shutdown: crate::signal::ShutdownArgs,
    /// Task records kept in memory with their KV revisions, so a task instance's next event
    /// needs no read (compare-and-set still guards every write); 0 reads each from KV.
    #[arg(
        long,
        env = "PODSTREAM_PROCESS_CACHED_RECORDS",
        default_value_t = service::DEFAULT_CACHED_RECORDS
    )]
    pub cached_records: usize,
    #[command(flatten)]
    pub rules: RulesArgs,
    #[command(flatten)]
    pub spark: crate::args::spark::SparkArgs,
    #[command(flatten)]
    pub spark_bucket: crate::args::spark::SparkBucketArgs,
}

impl ProcessArgs {
    /// The processor configuration these flags describe.
    pub fn config(&self) -> anyhow::Result<ProcessConfig> {
        let subjects = self.streams.prefix.subjects()?;
        Ok(ProcessConfig {
            bus: self
                .streams
                .bus(self.nats.url(), self.nats.security.security()),
            schedulers: self
                .scheduler
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            consumer: self.consumer.clone(),
            bucket: self.bucket.clone().unwrap_or_else(|| {
                subjects.resource_name(podstream_bus::streams::RECORDS_BUCKET_ROLE)
            }),
            rules: self.rules.rules()?,
            batch_size: self.batch_size,
            concurrency: self.concurrency,
            failover: std::time::Duration::from_secs(self.failover_seconds.max(1)),
            ack_wait: self.ack_wait.ack_wait(),
            cached_records: self.cached_records,
            spark_bucket: self.spark_bucket.bucket(&self.spark, &subjects),
            health: podstream_bus::Health::new(),
        })
    }
}

/// Runs until SIGINT/SIGTERM.
pub fn run(args: &ProcessArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    runtime.block_on(async {
        let health = args.ops.serve().await?;
        let config = ProcessConfig {
            health,
            ..args.config()?
        };
        let stats = args
            .shutdown
            .run(|shutdown| service::run(config, shutdown))
            .await?;
        eprintln!("processor stopped: {stats}");
        Ok(())
    })
}

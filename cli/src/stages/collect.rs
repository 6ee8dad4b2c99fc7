//! `podstream collect`: worker pods deleted once, by the collection rule (docs/semantics.md
//! "Collecting worker pods").

use anyhow::Context;
use clap::Args;
use podstream_collector::service::{self, CollectConfig};

use crate::args::collect::CollectionArgs;
use crate::args::stream::{AckWaitArgs, NatsArgs, StreamArgs};

/// Flags of `podstream collect`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  podstream collect --nats nats://nats:4222 --namespaces airflow\n  podstream collect --nats nats://nats:4222 --delete-worker-pods-on-failure true --collect-live-pods    # with process --require-signed-pods"
)]
pub struct CollectArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub ops: crate::args::ops::OpsArgs,
    #[command(flatten)]
    pub streams: StreamArgs,
    #[command(flatten)]
    pub kube: crate::args::kube::KubeArgs,
    #[command(flatten)]
    pub collection: CollectionArgs,
    /// Durable consumer name.
    #[arg(long, env = "PODSTREAM_COLLECT_CONSUMER", default_value = service::DEFAULT_CONSUMER)]
    pub consumer: String,
    /// KV bucket of the pods collected [default: <prefix>-collect].
    #[arg(long, env = "PODSTREAM_COLLECT_BUCKET")]
    pub bucket: Option<String>,
    /// The processor's KV bucket of task records, which each pod is judged on (`podstream
    /// process --bucket`) [default: <prefix>-process].
    #[arg(long, env = "PODSTREAM_PROCESS_BUCKET")]
    pub process_bucket: Option<String>,
    /// Commands judged at once.
    #[arg(long, env = "PODSTREAM_COLLECT_CONCURRENCY", default_value_t = service::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Seconds a silent instance keeps the consumer before a standby instance takes over.
    #[arg(long, env = "PODSTREAM_FAILOVER_SECONDS", default_value_t = podstream_bus::config::DEFAULT_FAILOVER_SECONDS)]
    pub failover_seconds: u64,
    #[command(flatten)]
    pub ack_wait: AckWaitArgs,
    #[command(flatten)]
    pub shutdown: crate::signal::ShutdownArgs,
}

impl CollectArgs {
    /// The collector configuration these flags describe.
    pub fn config(&self) -> anyhow::Result<CollectConfig> {
        let subjects = self.streams.prefix.subjects()?;
        Ok(CollectConfig {
            bus: self
                .streams
                .bus(self.nats.url(), self.nats.security.security()),
            consumer: self.consumer.clone(),
            bucket: self
                .bucket
                .clone()
                .unwrap_or_else(|| subjects.resource_name(service::BUCKET_ROLE)),
            records_bucket: self.process_bucket.clone().unwrap_or_else(|| {
                subjects.resource_name(podstream_bus::streams::RECORDS_BUCKET_ROLE)
            }),
            settings: self.collection.settings(self.kube.namespaces()),
            concurrency: self.concurrency,
            failover: std::time::Duration::from_secs(self.failover_seconds.max(1)),
            ack_wait: self.ack_wait.ack_wait(),
            health: podstream_bus::Health::new(),
        })
    }
}

/// Runs until SIGINT/SIGTERM.
pub fn run(args: &CollectArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    runtime.block_on(async {
        let health = args.ops.serve().await?;
        let config = CollectConfig {
            health,
            ..args.config()?
        };
        let kube =
            podstream_ingest::service::kube_client(args.kube.context.kube_context.as_deref())
                .await?;
        let stats = args
            .shutdown
            .run(|shutdown| service::run(config, kube, shutdown))
            .await?;
        eprintln!("collector stopped: {stats}");
        Ok(())
    })
}

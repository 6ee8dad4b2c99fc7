//! `podstream ingest`: every worker-pod event onto JetStream (docs/contract.md §2).

use anyhow::Context;
use clap::Args;
use podstream_ingest::service::{self, IngestConfig};

use crate::args::kube::KubeArgs;
use crate::args::lease::LeaseArgs;
use crate::args::stream::{NatsArgs, StreamArgs};

/// Flags of `podstream ingest`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  KUBECONFIG=~/.kube/config podstream ingest --nats nats://127.0.0.1:4222 --namespaces airflow"
)]
pub struct IngestArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub streams: StreamArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
    #[command(flatten)]
    pub ops: crate::args::ops::OpsArgs,
    /// Publishes awaiting their ack at most.
    #[arg(long, env = "PODSTREAM_ACK_WINDOW", default_value_t = service::DEFAULT_ACK_WINDOW)]
    pub ack_window: usize,
    /// KV bucket of the ingest checkpoint [default: <prefix>-ingest].
    #[arg(long, env = "PODSTREAM_CHECKPOINT_BUCKET")]
    pub checkpoint_bucket: Option<String>,
    #[command(flatten)]
    pub selector: crate::args::kube::PodSelectorArgs,
    /// Milliseconds between checkpoint writes at most: each write rewrites the shards whose
    /// pods changed. After a crash, what was published since the last write is published
    /// again, which the duplicate window absorbs, so it must stay well under that window.
    #[arg(
        long,
        env = "PODSTREAM_CHECKPOINT_INTERVAL_MS",
        default_value_t = service::DEFAULT_CHECKPOINT_INTERVAL_MS
    )]
    pub checkpoint_interval_ms: u64,
    #[command(flatten)]
    pub shutdown: crate::signal::ShutdownArgs,
    #[command(flatten)]
    pub spark: crate::args::spark::SparkArgs,
}

impl IngestArgs {
    /// The ingest configuration these flags describe.
    pub fn config(&self) -> anyhow::Result<IngestConfig> {
        let subjects = self.streams.prefix.subjects()?;
        Ok(IngestConfig {
            bus: self
                .streams
                .bus(self.nats.url(), self.nats.security.security()),
            namespaces: self.kube.namespaces(),
            kube_context: self.kube.context.kube_context.clone(),
            pod_selector: self.selector.pod_selector.clone(),
            ack_window: self.ack_window,
            checkpoint_bucket: self
                .checkpoint_bucket
                .clone()
                .unwrap_or_else(|| subjects.resource_name(service::CHECKPOINT_ROLE)),
            checkpoint_interval: std::time::Duration::from_millis(self.checkpoint_interval_ms),
            lease: self.lease.lease(&subjects),
            spark: self.spark.spark,
            health: podstream_bus::Health::new(),
        })
    }
}

/// Runs until SIGINT/SIGTERM.
pub fn run(args: &IngestArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    runtime.block_on(async {
        let health = args.ops.serve().await?;
        let config = IngestConfig {
            health,
            ..args.config()?
        };
        let kube = service::kube_client(config.kube_context.as_deref()).await?;
        // A task on the runtime's workers, not the main thread's `block_on`: the watch and the
        // NATS connection wake it many times a second, and a worker serves that more cheaply.
        let stats = args
            .shutdown
            .run(|shutdown| async move {
                let stats = tokio::spawn(service::run(config, kube, shutdown))
                    .await
                    .context("the ingest task failed")??;
                anyhow::Ok(stats)
            })
            .await?;
        eprintln!("ingest stopped: {stats}");
        Ok(())
    })
}

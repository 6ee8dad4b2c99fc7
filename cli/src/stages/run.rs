//! `podstream run`: ingest, processor and sink (and, with `--collect-pods`, the collector) in
//! one process (docs/contract.md §4), for small installs. Without `--nats` it starts a local
//! `nats-server` on `--data-dir`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podstream_bus::local_server::{LocalServer, find_binary};
use podstream_bus::streams::RECORDS_BUCKET_ROLE;
use podstream_collector::service::CollectConfig;
use podstream_ingest::service::{CHECKPOINT_ROLE, IngestConfig, kube_client};
use podstream_processor::service::ProcessConfig;
use podstream_sink::Database;
use podstream_sink::service::SinkConfig;

use crate::args::db::DbArgs;
use crate::args::kube::KubeArgs;
use crate::args::lease::LeaseArgs;
use crate::args::retention::RetentionArgs;
use crate::args::stream::{AckWaitArgs, StreamArgs};
use crate::offline::decide::RulesArgs;
use crate::signal::ShutdownArgs;
use crate::stages::pipeline::{Pipeline, PipelineConfig};

/// Flags of `podstream run`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    podstream run                                   # local nats-server, $AIRFLOW_HOME/airflow.db, KUBECONFIG\n  \
    podstream run --nats nats://nats:4222 --db postgres://airflow@db:5432/airflow --namespaces airflow")]
#[command(mut_arg("nats", |arg| arg.help(
    "NATS server with JetStream (several, comma-separated, for a cluster); without it, a local \
     nats-server is started on --data-dir"
)))]
pub struct RunArgs {
    #[command(flatten)]
    pub nats: crate::args::stream::NatsArgs,
    /// Storage of the local nats-server (ignored with --nats).
    #[arg(long, env = "PODSTREAM_DATA_DIR", default_value = "podstream-data")]
    pub data_dir: PathBuf,
    /// Port of the local nats-server (ignored with --nats).
    #[arg(long, env = "PODSTREAM_NATS_PORT", default_value_t = 4222)]
    pub nats_port: u16,
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub selector: crate::args::kube::PodSelectorArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
    #[command(flatten)]
    pub ops: crate::args::ops::OpsArgs,
    #[command(flatten)]
    pub streams: StreamArgs,
    #[command(flatten)]
    pub rules: RulesArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub sink_batching: crate::stages::sink::SinkBatchArgs,
    #[command(flatten)]
    pub ack_wait: AckWaitArgs,
    #[command(flatten)]
    pub shutdown: ShutdownArgs,
    #[command(flatten)]
    pub spark: crate::args::spark::SparkArgs,
    #[command(flatten)]
    pub spark_bucket: crate::args::spark::SparkBucketArgs,
    /// Run the collector too: worker pods deleted once, by the collection rule (then set the
    /// executor's `[podstream] collect_pods = True` so it deletes none itself).
    #[arg(long, env = "PODSTREAM_COLLECT_PODS")]
    pub collect_pods: bool,
    #[command(flatten)]
    pub collection: crate::args::collect::CollectionArgs,
}

impl RunArgs {
    /// The pipeline these flags describe; its buckets and Lease are the prefix's.
    fn config(&self, nats_url: &str) -> anyhow::Result<PipelineConfig> {
        let subjects = self.streams.prefix.subjects()?;
        Ok(PipelineConfig {
            bus: self.streams.bus(nats_url, self.nats.security.security()),
            ingest: IngestConfig {
                namespaces: self.kube.namespaces(),
                kube_context: self.kube.context.kube_context.clone(),
                pod_selector: self.selector.pod_selector.clone(),
                checkpoint_bucket: subjects.resource_name(CHECKPOINT_ROLE),
                lease: self.lease.lease(&subjects),
                spark: self.spark.spark,
                ..IngestConfig::default()
            },
            process: ProcessConfig {
                bucket: subjects.resource_name(RECORDS_BUCKET_ROLE),
                rules: self.rules.rules()?,
                ack_wait: self.ack_wait.ack_wait(),
                spark_bucket: self.spark_bucket.bucket(&self.spark, &subjects),
                ..ProcessConfig::default()
            },
            sink: self.sink_batching.batching(SinkConfig {
                applied_retention: self.retention.applied_retention_hours,
                ack_wait: self.ack_wait.ack_wait(),
                ..SinkConfig::default()
            }),
            collect: self.collect_pods.then(|| CollectConfig {
                bucket: subjects.resource_name(podstream_collector::service::BUCKET_ROLE),
                records_bucket: subjects.resource_name(RECORDS_BUCKET_ROLE),
                settings: self.collection.settings(self.kube.namespaces()),
                ack_wait: self.ack_wait.ack_wait(),
                ..CollectConfig::default()
            }),
        })
    }
}

/// Runs until SIGINT/SIGTERM.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let db_target = args.db.target_or_airflow_default()?;
    let (mut local, nats_url) = match &args.nats.nats {
        Some(url) => (None, url.clone()),
        None => {
            let dir = args.data_dir.join("nats");
            let server = LocalServer::start_with_token(&find_binary(), &dir, args.nats_port)
                .context("starting the local nats-server")?;
            eprintln!(
                "podstream: local nats-server at {} (storage {}; its token in {}, for --nats-token-file)",
                server.url(),
                dir.display(),
                server
                    .token_file()
                    .map_or_else(|| "-".to_owned(), |f| f.display().to_string())
            );
            let url = server.client_url();
            (Some(server), url)
        }
    };
    let mut config = args.config(&nats_url)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    let result = runtime.block_on(async {
        // One endpoint for the three stages: ready when all are.
        let health = args.ops.serve().await?;
        config.ingest.health = health.clone();
        config.process.health = health.clone();
        config.sink.health = health.clone();
        if let Some(collect) = config.collect.as_mut() {
            collect.health = health;
        }
        let kube = kube_client(args.kube.context.kube_context.as_deref()).await?;
        let db = Database::connect_to(&db_target)
            .await?
            .with_policy(args.db.policy());
        eprintln!(
            "podstream: running ingest, processor and sink (db {})",
            db_target.redacted()
        );
        let summaries = args
            .shutdown
            .run(|shutdown| Pipeline::start(config, kube, db).run_until(shutdown))
            .await?;
        for summary in summaries {
            eprintln!("podstream: {summary}");
        }
        Ok(())
    });
    if let Some(server) = local.as_mut() {
        server.stop();
    }
    result
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use podstream_sink::service::SinkConfig;

    use super::RunArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn sink_config(flags: &[&str]) -> SinkConfig {
        let args = ["podstream"].iter().chain(flags);
        let cli = Cli::try_parse_from(args).unwrap();
        cli.run.config("nats://127.0.0.1:4222").unwrap().sink
    }

    #[test]
    fn run_batches_its_sink_by_the_sink_defaults_unless_told_otherwise() {
        let defaults = SinkConfig::default();
        for (flags, size, wait, lanes) in [
            (
                &[][..],
                defaults.batch_size,
                defaults.batch_wait,
                defaults.connections,
            ),
            (
                &[
                    "--batch-size",
                    "50",
                    "--batch-wait-ms",
                    "7",
                    "--connections",
                    "2",
                ][..],
                50,
                Duration::from_millis(7),
                2,
            ),
        ] {
            let sink = sink_config(flags);
            assert_eq!(
                (sink.batch_size, sink.batch_wait, sink.connections),
                (size, wait, lanes),
                "{flags:?}"
            );
        }
    }
}

//! Ingest, processor, sink and (with `--collect-pods`) collector in one process, for `podstream
//! run` and `podstream demo`: a task each with one shutdown, and a failure of any one stops the
//! others.

use std::future::Future;

use anyhow::Context as _;
use podstream_bus::BusConfig;
use podstream_collector::service::{self as collect, CollectConfig};
use podstream_ingest::service::{self as ingest, IngestConfig};
use podstream_processor::service::{self as process, ProcessConfig};
use podstream_sink::Database;
use podstream_sink::service::{self as sink, SinkConfig};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The components' configurations, on one bus: `bus` replaces each one's own.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The NATS server, prefix and stream settings all three use.
    pub bus: BusConfig,
    /// The ingest.
    pub ingest: IngestConfig,
    /// The processor.
    pub process: ProcessConfig,
    /// The sink.
    pub sink: SinkConfig,
    /// The collector, when pods are collected.
    pub collect: Option<CollectConfig>,
}

/// A running pipeline.
pub struct Pipeline {
    stop: watch::Sender<bool>,
    tasks: JoinSet<anyhow::Result<String>>,
}

impl Pipeline {
    /// Starts the components.
    pub fn start(config: PipelineConfig, kube: kube::Client, db: Database) -> Pipeline {
        let (stop, stopped) = watch::channel(false);
        let until = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let mut tasks = JoinSet::new();
        let PipelineConfig {
            bus,
            ingest: mut ingest_config,
            process: mut process_config,
            sink: mut sink_config,
            collect: collect_config,
        } = config;
        ingest_config.bus = bus.clone();
        process_config.bus = bus.clone();
        sink_config.bus = bus.clone();
        if let Some(mut collect_config) = collect_config {
            collect_config.bus = bus;
            let kube = kube.clone();
            let stopped = until();
            tasks.spawn(async move {
                let stats = collect::run(collect_config, kube, stopped)
                    .await
                    .context("collector")?;
                Ok(format!("collector: {stats}"))
            });
        }
        let stopped = until();
        tasks.spawn(async move {
            let stats = ingest::run(ingest_config, kube, stopped)
                .await
                .context("ingest")?;
            Ok(format!("ingest: {stats}"))
        });
        let stopped = until();
        tasks.spawn(async move {
            let stats = process::run(process_config, stopped)
                .await
                .context("processor")?;
            Ok(format!("processor: {stats}"))
        });
        let stopped = until();
        tasks.spawn(async move {
            let summary = sink::run(sink_config, db, stopped).await.context("sink")?;
            Ok(format!("sink: {summary}"))
        });
        Pipeline { stop, tasks }
    }

    /// Runs until `shutdown` resolves or a component fails; then stops them all and returns
    /// each one's closing summary.
    pub async fn run_until(
        mut self,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<Vec<String>> {
        tokio::pin!(shutdown);
        let early = tokio::select! {
            _ = &mut shutdown => None,
            Some(ended) = self.tasks.join_next() => Some(ended),
        };
        let mut summaries = Vec::new();
        let mut failure = None;
        if let Some(ended) = early {
            match ended.context("a component panicked").and_then(|r| r) {
                Ok(summary) => {
                    failure = Some(anyhow::anyhow!(
                        "a component stopped on its own ({summary})"
                    ))
                }
                Err(error) => failure = Some(error),
            }
        }
        let _ = self.stop.send(true);
        while let Some(ended) = self.tasks.join_next().await {
            match ended.context("a component panicked").and_then(|r| r) {
                Ok(summary) => summaries.push(summary),
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(summaries),
        }
    }
}

//! `podstream check <component> [its flags]`: from a component's own configuration (the same
//! flags and environment its Deployment gives it), tries each thing it needs without changing
//! anything (NATS login, its streams and buckets and their replicas, the Kubernetes
//! permissions of the ingest and the collector, the sink's database privileges) and prints
//! one line per item:
//! `ok` with what it found, or `FAIL` with what to fix. The exit status is the first
//! failure's kind (docs/reference.md, exit status).

mod database;
mod kubernetes;
mod nats;

use std::fmt;

use clap::{Args, Subcommand};
use podstream_bus::fault::{Classified, Fault};

use crate::stages::collect::CollectArgs;
use crate::stages::ingest::IngestArgs;
use crate::stages::process::ProcessArgs;
use crate::stages::sink::SinkArgs;

/// Flags of `podstream check`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example, in the sink's pod:\n  podstream check sink --nats-user=podstream-sink --nats-password-file=/var/run/secrets/podstream/nats/password --db-password-file=/var/run/secrets/podstream/db/password"
)]
pub struct CheckArgs {
    #[command(subcommand)]
    component: Component,
}

/// The component whose configuration is checked, with its own flags.
#[derive(Debug, Subcommand)]
enum Component {
    /// The ingest: NATS, its streams and checkpoint bucket, its Kubernetes permissions.
    Ingest(IngestArgs),
    /// The processor: NATS, its streams and bucket, its rules and signing key.
    Process(ProcessArgs),
    /// The sink: NATS, its streams, the database and the role's privileges.
    Sink(SinkArgs),
    /// The collector: NATS, its streams and buckets, its Kubernetes permissions on pods.
    Collect(CollectArgs),
}

/// What one check found.
#[derive(Debug)]
enum Verdict {
    Pass(String),
    Fail(Fault, String),
}

/// The lines of a check, in order.
#[derive(Debug, Default)]
pub(crate) struct Report {
    lines: Vec<(String, Verdict)>,
}

impl Report {
    /// `item` is as needed; `found` says how.
    pub(crate) fn pass(&mut self, item: impl Into<String>, found: impl Into<String>) {
        self.lines.push((item.into(), Verdict::Pass(found.into())));
    }

    /// `item` is not as needed: a failure of kind `fault`, and what to do.
    pub(crate) fn fail(&mut self, item: impl Into<String>, fault: Fault, fix: impl Into<String>) {
        self.lines
            .push((item.into(), Verdict::Fail(fault, fix.into())));
    }

    /// The first failure's kind, and how many failed.
    fn failed(&self) -> Option<ChecksFailed> {
        let failures: Vec<Fault> = self
            .lines
            .iter()
            .filter_map(|(_, verdict)| match verdict {
                Verdict::Fail(fault, _) => Some(*fault),
                Verdict::Pass(_) => None,
            })
            .collect();
        failures.first().map(|&fault| ChecksFailed {
            fault,
            failed: failures.len(),
            checked: self.lines.len(),
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (item, verdict) in &self.lines {
            match verdict {
                Verdict::Pass(found) => writeln!(f, "ok    {item}: {found}")?,
                Verdict::Fail(_, fix) => writeln!(f, "FAIL  {item}: {fix}")?,
            }
        }
        Ok(())
    }
}

/// Some checks failed; the exit status is the first one's kind.
#[derive(Debug, thiserror::Error)]
#[error("{failed} of {checked} checks failed")]
pub struct ChecksFailed {
    fault: Fault,
    failed: usize,
    checked: usize,
}

impl Classified for ChecksFailed {
    fn fault(&self) -> Fault {
        self.fault
    }
}

/// Runs the component's checks and prints one line per item on standard output.
pub fn run(args: &CheckArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(async {
        let mut report = Report::default();
        match &args.component {
            Component::Ingest(args) => ingest(args, &mut report).await,
            Component::Process(args) => process(args, &mut report).await,
            Component::Sink(args) => sink(args, &mut report).await,
            Component::Collect(args) => collect(args, &mut report).await,
        }
        report
    });
    print!("{report}");
    match report.failed() {
        Some(failed) => Err(failed.into()),
        None => Ok(()),
    }
}

/// A configuration that does not parse ends the check: nothing else can be tried with it.
fn configured<T>(report: &mut Report, config: anyhow::Result<T>) -> Option<T> {
    match config {
        Ok(config) => {
            report.pass("configuration", "the flags and environment parse");
            Some(config)
        }
        Err(error) => {
            report.fail("configuration", Fault::Configuration, format!("{error:#}"));
            None
        }
    }
}

async fn ingest(args: &IngestArgs, report: &mut Report) {
    use podstream_ingest::service;
    let Some(config) = configured(report, args.config()) else {
        return;
    };
    let buckets = [config.checkpoint_bucket.as_str()];
    nats::check(
        report,
        &config.bus,
        service::CLIENT,
        &service::streams(&config),
        &buckets,
    )
    .await;
    let needed =
        podstream_ingest::access::needed(&config.namespaces, config.lease.as_ref(), config.spark);
    let role = "the ingest's Role (deploy/base/rbac.yaml, or the chart's)";
    kubernetes::check(report, config.kube_context.as_deref(), &needed, role).await;
}

async fn process(args: &ProcessArgs, report: &mut Report) {
    use podstream_processor::service;
    let Some(config) = configured(report, args.config()) else {
        return;
    };
    let buckets: Vec<&str> = std::iter::once(config.bucket.as_str())
        .chain(config.spark_bucket.as_deref())
        .collect();
    nats::check(
        report,
        &config.bus,
        service::CLIENT,
        &service::streams(&config),
        &buckets,
    )
    .await;
}

async fn sink(args: &SinkArgs, report: &mut Report) {
    use podstream_sink::service;
    let Some(target) = configured(report, args.db.target()) else {
        return;
    };
    let bus = args
        .streams
        .bus(args.nats.url(), args.nats.security.security());
    nats::check(report, &bus, service::CLIENT, &service::STREAMS, &[]).await;
    database::check(report, &target).await;
}

async fn collect(args: &CollectArgs, report: &mut Report) {
    use podstream_collector::{pods, service};
    let Some(config) = configured(report, args.config()) else {
        return;
    };
    let buckets = [config.bucket.as_str(), config.records_bucket.as_str()];
    nats::check(
        report,
        &config.bus,
        service::CLIENT,
        &service::STREAMS,
        &buckets,
    )
    .await;
    let needed = podstream_ingest::access::on_pods(
        &pods::verbs(&config.settings),
        &config.settings.namespaces,
    );
    let role = "the collector's Role (deploy/collector/rbac.yaml, or the chart's)";
    let context = args.kube.context.kube_context.as_deref();
    kubernetes::check(report, context, &needed, role).await;
}

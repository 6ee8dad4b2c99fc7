//! `podstream decide [FILE]`: the processor's rules as a filter
//! (docs/contract.md §1). Kubernetes JSON in, one JSON line per command out.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use podstream_ingest::pod_json::{Projected, project_watch_event};
use podstream_ingest::project;
use podstream_ingest::watch_json::{WatchItem, read_json};
use podstream_proto::line::CommandLine;
use podstream_proto::v1::{PodEvent, PodRef, SparkEvent};
use podstream_rules::spark::SparkJobs;
use podstream_rules::{MemoryStore, Processor, Rules};
use tracing::{debug, info, warn};

use crate::offline::json_stream::{Frame, JsonFrames, MAX_VALUE_BYTES, Next};
use crate::offline::read_ahead::ReadAhead;
use crate::offline::spark_json::spark_items;

/// Arguments of `podstream decide`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example, against a live cluster:\n  \
    kubectl get pods -l airflow-worker -A -w --output-watch-events -o json | podstream decide\n\
    Spark driver pods, after their applications' current state:\n  \
    kubectl get sparkapplications -A -o json > apps.json\n  \
    kubectl get pods -l spark-role=driver,spark_kubernetes_operator=True -A -w --output-watch-events -o json | cat apps.json - | podstream decide")]
pub struct DecideArgs {
    /// Kubernetes JSON to read: watch events, Pods or PodLists, one per line
    /// or pretty-printed; Spark driver pods (`spark-role=driver`,
    /// `spark_kubernetes_operator=True`, as Airflow's operator labels them) and their
    /// SparkApplications too. Standard input when absent or `-`.
    pub file: Option<PathBuf>,

    #[command(flatten)]
    pub rules: RulesArgs,
}

/// Flags of the rules, shared by `decide`, `process`, `run` and `replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct RulesArgs {
    /// Container waiting reasons that fail a pending pod, comma-separated;
    /// each is trimmed.
    #[arg(
        long,
        env = "PODSTREAM_FATAL_REASONS",
        default_value_t = podstream_rules::table::DEFAULT_FATAL_REASONS.join(",")
    )]
    pub fatal_reasons: String,
    /// Treat a pod without a valid `podstream.io/signature` (written by
    /// `PodstreamKubernetesExecutor`) as foreign: recorded, never driving a task. Needs
    /// `--pod-signing-key-file`.
    #[arg(
        long,
        env = "PODSTREAM_REQUIRE_SIGNED_PODS",
        requires = "pod_signing_key_file"
    )]
    pub require_signed_pods: bool,
    /// A file holding a pod-signing key (at least 32 bytes, surrounding whitespace
    /// trimmed): the executors' current key, then, while rotating, the previous one
    /// (comma-separated in the variable).
    #[arg(
        long,
        env = "PODSTREAM_POD_SIGNING_KEY_FILE",
        value_delimiter = ',',
        value_name = "FILE"
    )]
    pub pod_signing_key_file: Vec<PathBuf>,
}

/// A pod-signing key file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SigningKeyError {
    /// The file cannot be read.
    #[error("cannot read pod-signing key file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The keys are not a usable set.
    #[error("pod-signing keys: {0}")]
    Keys(#[from] podstream_proto::signature::KeyError),
}

impl RulesArgs {
    /// The rules these flags describe; the signing keys are read now.
    pub fn rules(&self) -> Result<Rules, SigningKeyError> {
        let rules = Rules::from_comma_list(&self.fatal_reasons);
        if !self.require_signed_pods {
            return Ok(rules);
        }
        let keys = self
            .pod_signing_key_file
            .iter()
            .map(|path| {
                std::fs::read(path).map_err(|source| SigningKeyError::Read {
                    path: path.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rules.requiring_signatures(podstream_proto::signature::PodSigning::new(keys)?))
    }
}

/// Counts of one `decide` run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Pod events read.
    pub events: u64,
    /// Command lines written.
    pub commands: u64,
    /// `invalid` lines written.
    pub invalid: u64,
}

/// Runs `decide` on the arguments' input, writing to standard output.
pub fn run(args: &DecideArgs) -> anyhow::Result<Summary> {
    let input: Box<dyn Read + Send> = match args.file.as_deref() {
        None => Box::new(io::stdin()),
        Some(path) if path.as_os_str() == "-" => Box::new(io::stdin()),
        Some(path) => {
            Box::new(File::open(path).with_context(|| format!("cannot open {}", path.display()))?)
        }
    };
    let stdout = io::stdout();
    let mut processor = Processor::new(args.rules.rules()?, MemoryStore::default());
    let summary = decide_stream(input, &mut stdout.lock(), &mut processor)?;
    // The command ends here, and the process's exit frees its memory at once: dropping the
    // state would free every task record one by one first.
    std::mem::forget(processor);
    info!(
        events = summary.events,
        commands = summary.commands,
        invalid = summary.invalid,
        "decide finished"
    );
    Ok(summary)
}

/// Decides every pod event of `input` in order with `processor`, writing JSON lines to `out`.
/// Fails only when the input cannot be read or the output written.
///
/// Worker threads read the input ahead and project its lines (the bulk of the work); this
/// thread frames what they could not read and decides everything in input order.
pub fn decide_stream(
    input: Box<dyn Read + Send>,
    out: &mut impl Write,
    processor: &mut Processor<MemoryStore>,
) -> anyhow::Result<Summary> {
    let mut spark_jobs = SparkJobs::default();
    let mut summary = Summary::default();
    let mut out = io::BufWriter::new(out);
    let ahead = ReadAhead::spawn(input, worker_pod_event, MAX_VALUE_BYTES)
        .context("cannot start reading input")?;
    let projections = ahead.projections();
    let mut frames = JsonFrames::new(ahead);
    while let Some(read) =
        frames.next_with(|line_no, available| projections.take(line_no, available.len()))
    {
        let value = match read.context("cannot read input")? {
            Next::Fast(event) => {
                decide_one(processor, Ok(event), &mut out, &mut summary)?;
                flush_when_idle(&mut frames, &mut out)?;
                continue;
            }
            Next::Frame(Frame::Value(value)) => value,
            Next::Frame(Frame::Invalid(error)) => {
                warn!(%error, "skipping input that is not JSON");
                write_line(
                    &mut out,
                    &CommandLine::invalid(error, None),
                    &mut summary.invalid,
                )?;
                continue;
            }
        };
        let raw = value.get();
        // Spark objects are rare and read whole. One scan for what `spark-role` and
        // `SparkApplication` share keeps worker pods on the fast path; a false hit only
        // costs a full parse.
        let spark = raw
            .contains("park")
            .then(|| serde_json::from_str::<serde_json::Value>(raw).ok())
            .flatten();
        match spark.as_ref().and_then(spark_items) {
            Some(split) => {
                for item in split.items {
                    decide_spark(&mut spark_jobs, item, &mut out, &mut summary)?;
                }
                for other in split.others {
                    decide_workers(&other.to_string(), processor, &mut out, &mut summary)?;
                }
            }
            None => decide_workers(raw, processor, &mut out, &mut summary)?,
        }
        flush_when_idle(&mut frames, &mut out)?;
    }
    out.flush().context("cannot write output")?;
    Ok(summary)
}

/// A line that is one worker pod's watch event, read and projected in one pass (on a
/// read-ahead worker); `None` for anything else (a Spark object, a pod that cannot be
/// projected, not JSON), which the framer then frames and the slow path reports on.
fn worker_pod_event(line: &str) -> Option<PodEvent> {
    // What `spark-role` and `SparkApplication` share (see `decide_stream`).
    if memchr::memmem::find(line.as_bytes(), b"park").is_some() {
        return None;
    }
    project_watch_event(line)?.ok()
}

/// Live input (a kubectl watch): show results before blocking on more.
fn flush_when_idle(
    frames: &mut JsonFrames<ReadAhead<PodEvent>>,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if !frames.reader_mut().has_ready_input() {
        out.flush().context("cannot write output")?;
    }
    Ok(())
}

/// Decides the worker-pod events of one JSON value as lines of `out`.
fn decide_workers(
    raw: &str,
    processor: &mut Processor<MemoryStore>,
    out: &mut impl Write,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    // Nearly every value is a pod watch event: read only what the rules need.
    if let Some(projected) = project_watch_event(raw) {
        return decide_one(processor, projected, out, summary);
    }
    for item in read_json(raw) {
        match item {
            WatchItem::Pod { event_type, pod } => {
                let projected = project(event_type, &pod)
                    .map_err(|err| (err, podstream_ingest::projection::pod_ref(&pod)));
                decide_one(processor, projected, out, summary)?;
            }
            WatchItem::Bookmark { resource_version } => {
                debug!(%resource_version, "bookmark")
            }
            WatchItem::WatchError { message } => {
                warn!(%message, "watch reported an error")
            }
            WatchItem::Invalid { error, pod } => {
                warn!(%error, "skipping a value that is not a pod");
                write_line(out, &CommandLine::invalid(error, pod), &mut summary.invalid)?;
            }
        }
    }
    Ok(())
}

/// Decides one Spark object's event (or reports why it cannot be) as lines of `out`.
fn decide_spark(
    jobs: &mut SparkJobs,
    item: Result<SparkEvent, (String, PodRef)>,
    out: &mut impl Write,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    summary.events += 1;
    let commands = match item {
        Ok(event) => jobs.take(&event),
        Err((error, pod)) => {
            warn!(pod = %pod, uid = %pod.uid, %error, "Spark driver pod cannot be read");
            return write_line(
                out,
                &CommandLine::invalid(error, Some(pod)),
                &mut summary.invalid,
            );
        }
    };
    for command in commands {
        write_line(out, &CommandLine::from(&command), &mut summary.commands)?;
    }
    Ok(())
}

/// Decides one projected pod event (or reports why its pod cannot be) as lines of `out`.
fn decide_one(
    processor: &mut Processor<MemoryStore>,
    projected: Projected,
    out: &mut impl Write,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    summary.events += 1;
    let event = match projected {
        Ok(event) => event,
        Err((err, pod)) => {
            warn!(pod = %pod, uid = %pod.uid, error = %err, "pod cannot be projected");
            return write_line(
                out,
                &CommandLine::invalid(err.to_string(), Some(pod)),
                &mut summary.invalid,
            );
        }
    };
    // The in-memory store cannot fail; an event error is an invalid line.
    match processor.handle(&event) {
        Ok(commands) => {
            for command in commands {
                let line = CommandLine::from(&command.into_command());
                write_line(out, &line, &mut summary.commands)?;
            }
            Ok(())
        }
        Err(err) => write_line(
            out,
            &CommandLine::invalid(err.to_string(), event.pod),
            &mut summary.invalid,
        ),
    }
}

fn write_line(out: &mut impl Write, line: &CommandLine, counter: &mut u64) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, line).context("cannot write output")?;
    out.write_all(b"\n").context("cannot write output")?;
    *counter += 1;
    Ok(())
}

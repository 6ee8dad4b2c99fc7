//! `podstream`: one binary for every component of the pipeline.
//!
//! Rooms by command family: `stages/` (`run`, `ingest`, `process`, `sink`, `collect`), `history/`
//! (`tail`, `replay`, the timeline page), `offline/` (`decide`, `apply`), `world/` (`demo`,
//! `sim`, `kubelet`: the test world, left out of the production build), `check/` (`check`: a
//! component's configuration tried), `args/` (the flags they share); `exit_code.rs` and
//! `signal.rs` serve them all.

mod args;
mod check;
mod exit_code;
mod history;
mod offline;
mod signal;
mod stages;
#[cfg(feature = "test-world")]
mod world;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use history::{replay, tail};
use offline::{apply, decide};
use stages::{collect, ingest, process, run, sink};
use tracing_subscriber::EnvFilter;
#[cfg(feature = "test-world")]
use world::{demo, kubelet, sim};

/// mimalloc rather than the system allocator: every event and command is a
/// handful of short strings, and glibc's malloc is slow at that (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Airflow worker-pod events as a stream: ingest, decide, apply.
#[derive(Debug, Parser)]
#[command(name = "podstream", version, about, long_about = None, after_help = EXIT_STATUS)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines as text for people, or as one JSON object per line for a log pipeline
    /// (levels by `PODSTREAM_LOG`, e.g. `info`).
    #[arg(long, global = true, env = "PODSTREAM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
}

/// What `--help` says of the exit status (`exit_code.rs` decides it).
const EXIT_STATUS: &str = "Exit status: 0 success; 1 failure; 2 usage (a flag or value clap refuses); \
65 data (the database is not an Airflow one podstream works on); 69 unavailable (nats-server \
missing or older than 2.11, the database refusing); 78 configuration (a URL, credential, secret \
file or kubeconfig that is wrong, a Kubernetes permission the ingest lacks).";

/// How log lines are written to standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Text, coloured on a terminal.
    Human,
    /// One JSON object per line, with every field.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the processor's rules to Kubernetes JSON and print one JSON line
    /// per command (docs/contract.md §1).
    Decide(decide::DecideArgs),
    /// Watch every Airflow worker pod and publish its events on JetStream.
    Ingest(ingest::IngestArgs),
    /// Decide pod events from JetStream and publish commands (state in JetStream KV).
    Process(process::ProcessArgs),
    /// Apply `decide`'s JSON lines to an Airflow metadata DB, without NATS.
    Apply(apply::ApplyArgs),
    /// Apply commands from JetStream to an Airflow metadata DB.
    Sink(sink::SinkArgs),
    /// Delete worker pods once: those whose try ended, losing duplicates, superseded tries.
    Collect(collect::CollectArgs),
    /// Play the seed stories end to end on embedded parts and report (exit 0 if all end right).
    #[cfg(feature = "test-world")]
    Demo(demo::DemoArgs),
    /// Print the history of pod events and commands; --decide compares with today's rules.
    Replay(replay::ReplayArgs),
    /// Ingest, processor and sink in one process (a local nats-server without --nats).
    Run(run::RunArgs),
    /// Print pod events and commands as they happen.
    Tail(tail::TailArgs),
    /// Try what a component needs with its own flags (NATS, streams, Kubernetes permissions,
    /// database privileges) and print one line per item.
    Check(check::CheckArgs),
    /// Serve the Kubernetes API simulator (pods, namespaces, leases) until killed.
    #[cfg(feature = "test-world")]
    Sim(sim::SimArgs),
    /// Run the simulator's kubelet as a node of any API server (KUBECONFIG) until killed.
    #[cfg(feature = "test-world")]
    Kubelet(kubelet::KubeletArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to standard error; standard output is for results.
    let filter =
        EnvFilter::try_from_env("PODSTREAM_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Human => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().init(),
    }
    let result = match &cli.command {
        Command::Decide(args) => decide::run(args).map(|_| ()),
        #[cfg(feature = "test-world")]
        Command::Sim(args) => sim::run(args),
        #[cfg(feature = "test-world")]
        Command::Kubelet(args) => kubelet::run(args),
        Command::Ingest(args) => ingest::run(args),
        Command::Process(args) => process::run(args),
        Command::Apply(args) => apply::run(args),
        Command::Sink(args) => sink::run(args),
        Command::Collect(args) => collect::run(args),
        #[cfg(feature = "test-world")]
        Command::Demo(args) => demo::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Run(args) => run::run(args),
        Command::Tail(args) => tail::run(args),
        Command::Check(args) => check::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("podstream: {err:#}");
            exit_code::Exit::of(&err).into()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Issue 6: every flag has a `PODSTREAM_*` env var, every subcommand an example.
    #[test]
    fn every_flag_has_an_env_var_and_every_subcommand_an_example() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for sub in cli.get_subcommands() {
            let example = sub
                .get_after_help()
                .is_some_and(|h| h.to_string().contains("podstream "));
            if !example {
                missing.push(format!("{}: no example in --help", sub.get_name()));
            }
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_positional() || id == "help" || id == "version" {
                    continue;
                }
                let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
                if !env.starts_with("PODSTREAM_") {
                    missing.push(format!("{} --{id}: no PODSTREAM_* env var", sub.get_name()));
                }
            }
        }
        assert!(missing.is_empty(), "{missing:#?}");
    }
}

//! `podstream apply [FILE] --db URL`: `decide`'s JSON lines applied to a metadata DB, no NATS.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podstream_proto::Command;
use podstream_proto::line::CommandLine;
use podstream_sink::summary::Summary;
use podstream_sink::{Database, Item, Outcome};

use crate::args::db::DbArgs;

/// Flags of `podstream apply`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  podstream decide events.json | podstream apply --db sqlite:///abs/airflow.db"
)]
pub struct ApplyArgs {
    /// JSON lines from `podstream decide`; standard input when absent or `-`.
    file: Option<PathBuf>,
    #[command(flatten)]
    db: DbArgs,
    /// Commands per transaction.
    #[arg(long, env = "PODSTREAM_BATCH_SIZE", default_value_t = podstream_sink::service::DEFAULT_BATCH_SIZE)]
    batch_size: usize,
}

/// Applies every line; prints the one-line summary.
pub fn run(args: &ApplyArgs) -> anyhow::Result<()> {
    let reader: Box<dyn BufRead> = match &args.file {
        Some(path) if path.as_os_str() != "-" => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
        _ => Box::new(std::io::BufReader::new(std::io::stdin())),
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    let summary = runtime.block_on(async {
        let db = Database::connect_to(&args.db.target()?)
            .await?
            .with_policy(args.db.policy());
        let mut summary = Summary::default();
        let mut batch = Vec::with_capacity(args.batch_size);
        for (number, line) in reader.lines().enumerate() {
            let line = line.context("reading input")?;
            if line.trim().is_empty() {
                continue;
            }
            match parse(&line) {
                Ok(command) => batch.push(Item {
                    command,
                    sequence: None,
                }),
                Err(reason) => {
                    // No NATS here: the dead letter is reported on stderr, with its line.
                    eprintln!(
                        "podstream apply: line {}: dead-lettered: {reason}",
                        number + 1
                    );
                    summary.dead_lettered += 1;
                }
            }
            if batch.len() >= args.batch_size.max(1) {
                apply(&db, &mut batch, &mut summary).await?;
            }
        }
        apply(&db, &mut batch, &mut summary).await?;
        Ok::<_, anyhow::Error>(summary)
    })?;
    println!("{summary}");
    Ok(())
}

fn parse(line: &str) -> Result<Command, String> {
    let parsed: CommandLine =
        serde_json::from_str(line).map_err(|e| format!("not a command line: {e}"))?;
    let command = Command::try_from(parsed).map_err(|e| e.to_string())?;
    if command.id.is_empty() {
        return Err("command without an id".into());
    }
    Ok(command)
}

async fn apply(db: &Database, batch: &mut Vec<Item>, summary: &mut Summary) -> anyhow::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let outcomes = db.apply_batch(batch).await.context("applying commands")?;
    for (item, outcome) in batch.iter().zip(&outcomes) {
        if let Outcome::Dead(reason) = outcome {
            eprintln!(
                "podstream apply: command {}: dead-lettered: {reason}",
                item.command.id
            );
        }
        summary.add(outcome);
    }
    batch.clear();
    Ok(())
}

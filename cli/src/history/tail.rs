//! `podstream tail`: pod events, commands and the pods the collector collected, as they
//! happen, for people or for `jq`.

use crate::args::stream::{NatsArgs, PrefixArgs};
use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use podstream_proto::subject::ROLE_HEADER;

use crate::history::lines;

/// Flags of `podstream tail`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  podstream tail --scheduler 42\n  podstream tail --json | jq 'select(.kind == \"fail\")'"
)]
pub struct TailArgs {
    #[command(flatten)]
    nats: NatsArgs,
    #[command(flatten)]
    prefix: PrefixArgs,
    /// Only this scheduler's subjects (its job id, the `airflow-worker` value).
    #[arg(long, env = "PODSTREAM_SCHEDULER")]
    scheduler: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long, env = "PODSTREAM_JSON")]
    json: bool,
}

/// Prints until interrupted.
pub fn run(args: &TailArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    runtime.block_on(async {
        let subjects = args.prefix.subjects()?;
        let client = podstream_bus::connect(
            args.nats.url(),
            &args.nats.security.security(),
            "podstream-tail",
        )
        .await?;
        let scheduler = args.scheduler.as_deref();
        let pods = client
            .subscribe(subjects.pod_events_filter(scheduler))
            .await
            .context("subscribing to pod events")?;
        let commands = client
            .subscribe(subjects.commands_filter(scheduler))
            .await
            .context("subscribing to commands")?;
        // The pods the collector collected: its bucket's entries (all schedulers').
        let collected_subjects = podstream_collector::collected::entry_filter(&subjects);
        let collected = client
            .subscribe(collected_subjects.clone())
            .await
            .context("subscribing to the pods collected")?;
        client.flush().await.context("subscribing")?;
        eprintln!(
            "tailing {}, {} and {collected_subjects}",
            subjects.pod_events_filter(scheduler),
            subjects.commands_filter(scheduler)
        );
        let mut messages =
            futures::stream::select(futures::stream::select(pods, commands), collected);
        let shutdown = crate::signal::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            let message = tokio::select! {
                _ = &mut shutdown => break,
                message = messages.next() => match message {
                    Some(message) => message,
                    None => break,
                },
            };
            let role = message
                .headers
                .as_ref()
                .and_then(|h| h.get(ROLE_HEADER))
                .map(|v| v.as_str().to_owned());
            let line = lines::describe(
                &subjects,
                &message.subject,
                role.as_deref(),
                &message.payload,
                args.json,
            );
            println!("{line}");
        }
        Ok(())
    })
}

//! `podstream tail`: pod events and commands as they happen, for people or for `jq`.

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use podstream_proto::line::CommandLine;
use podstream_proto::subject::Subjects;
use podstream_proto::v1::EventType;
use podstream_proto::{Command, PodEvent};
use prost::Message as _;
use serde_json::json;

/// Flags of `podstream tail`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  podstream tail --scheduler 42\n  podstream tail --json | jq 'select(.kind == \"fail\")'"
)]
pub struct TailArgs {
    /// NATS server with JetStream.
    #[arg(long, env = "PODSTREAM_NATS", default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Subject prefix.
    #[arg(long, env = "PODSTREAM_PREFIX", default_value = "podstream")]
    prefix: String,
    /// Only this scheduler's subjects (its job id, the `airflow-worker` value).
    #[arg(long, env = "PODSTREAM_SCHEDULER")]
    scheduler: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints until interrupted.
pub fn run(args: &TailArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    runtime.block_on(async {
        let subjects = Subjects::new(&args.prefix).context("invalid --prefix")?;
        let client = podstream_bus::connect(&args.nats, "podstream-tail").await;
        let scheduler = args.scheduler.as_deref();
        let pods = client
            .subscribe(subjects.pod_events_filter(scheduler))
            .await
            .context("subscribing to pod events")?;
        let commands = client
            .subscribe(subjects.commands_filter(scheduler))
            .await
            .context("subscribing to commands")?;
        client.flush().await.context("subscribing")?;
        eprintln!(
            "tailing {} and {}",
            subjects.pod_events_filter(scheduler),
            subjects.commands_filter(scheduler)
        );
        let mut messages = futures::stream::select(pods, commands);
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
            let line = describe(&subjects, &message, args.json);
            println!("{line}");
        }
        Ok(())
    })
}

/// One message as a line of text or JSON.
fn describe(subjects: &Subjects, message: &async_nats::Message, as_json: bool) -> String {
    let subject = message.subject.as_str();
    let subject_owner = subjects
        .parse(subject)
        .map(|(owner, _)| owner)
        .unwrap_or_default();
    let role = message
        .headers
        .as_ref()
        .and_then(|h| h.get("Podstream-Role"))
        .map(|v| v.as_str().to_owned())
        .unwrap_or_else(|| "event".to_owned());
    if subject.starts_with(&format!("{}.pods.", subjects.prefix())) {
        match PodEvent::decode(message.payload.as_ref()) {
            Ok(event) => pod_line(&event, subject, &subject_owner, &role, as_json),
            Err(error) => undecodable(subject, &error.to_string(), as_json),
        }
    } else {
        match Command::decode(message.payload.as_ref()) {
            Ok(command) => command_line(&command, subject, as_json),
            Err(error) => undecodable(subject, &error.to_string(), as_json),
        }
    }
}

fn pod_line(
    event: &PodEvent,
    subject: &str,
    subject_owner: &str,
    role: &str,
    as_json: bool,
) -> String {
    let pod = event.pod.clone().unwrap_or_default();
    let kind = match event.r#type() {
        EventType::Added => "ADDED",
        EventType::Modified => "MODIFIED",
        EventType::Deleted => "DELETED",
        EventType::Unspecified => "?",
    };
    let phase = event
        .phase()
        .as_str_name()
        .trim_start_matches("PHASE_")
        .to_owned();
    let ti = event
        .task
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    if as_json {
        return json!({
            "stream": "pods", "subject": subject, "role": role, "type": kind, "owner": event.owner,
            "subject_owner": subject_owner, "pod": pod, "ti": event.task, "phase": phase,
            "resource_version": event.resource_version, "deleting": event.deletion_unix_ms.is_some(),
            "synthesized": event.synthesized,
        })
        .to_string();
    }
    let notice = if role == "left" {
        format!(" (left scheduler {subject_owner})")
    } else {
        String::new()
    };
    let synthesized = if event.synthesized {
        " synthesized"
    } else {
        ""
    };
    format!(
        "pod  {kind:<8}{synthesized} {}/{} rv={} owner={} phase={phase} ti={ti}{notice}",
        pod.namespace, pod.name, event.resource_version, event.owner
    )
}

fn command_line(command: &Command, subject: &str, as_json: bool) -> String {
    let line = CommandLine::from(command);
    if as_json {
        let mut value = serde_json::to_value(&line).unwrap_or_default();
        value["stream"] = json!("commands");
        value["subject"] = json!(subject);
        return value.to_string();
    }
    let pod = command.pod.clone().unwrap_or_default();
    let ti = command
        .task
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let reason = line
        .reason
        .map(|r| format!(" reason={r}"))
        .unwrap_or_default();
    let to = line.to.map(|t| format!(" to={t}")).unwrap_or_default();
    format!(
        "cmd  {:<8} {}/{} owner={} ti={ti}{reason}{to}",
        line.kind, pod.namespace, pod.name, command.owner
    )
}

fn undecodable(subject: &str, error: &str, as_json: bool) -> String {
    if as_json {
        json!({ "subject": subject, "error": error }).to_string()
    } else {
        format!("?    {subject}: not decodable: {error}")
    }
}

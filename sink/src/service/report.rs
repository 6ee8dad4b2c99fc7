//! What happens to each command once its lane has committed: its outcome logged and counted,
//! a refused one dead-lettered, and the message acked.

use async_nats::jetstream::{self, AckKind};
use podstream_bus::dead::DeadLetter;
use podstream_bus::in_flight::Held;
use podstream_proto::Command;
use podstream_proto::subject::{Stage, Subjects};

use crate::guard::Skip;
use crate::item::Outcome;
use crate::lanes::Applied;
use crate::summary::Summary;

/// What happens to each command once its lane has committed: dead letter, log, count, ack.
pub(super) async fn finish(
    js: &jetstream::Context,
    subjects: &Subjects,
    batch: Applied<Held>,
    summary: &mut Summary,
) {
    for (item, message, outcome) in batch {
        if let Outcome::Dead(reason) = &outcome {
            tracing::warn!(command = %item.command.id, %reason, "command dead-lettered");
            dead_letter(js, subjects, &message, reason).await;
        } else {
            log_outcome(&item.command, &outcome);
        }
        summary.add(&outcome);
        ack(&message).await;
    }
}

pub(super) async fn ack(message: &jetstream::Message) {
    if let Err(error) = message.ack_with(AckKind::Ack).await {
        // Unacked means redelivered; the applied-command record makes that harmless.
        tracing::warn!(%error, "ack failed; the command will be redelivered and skipped");
    }
}

pub(super) async fn dead_letter(
    js: &jetstream::Context,
    subjects: &Subjects,
    message: &jetstream::Message,
    reason: &str,
) {
    let dead = DeadLetter::of_message(subjects, Stage::Sink, message, reason.to_owned());
    podstream_bus::dead::store(js, &dead).await;
}

fn log_outcome(command: &Command, outcome: &Outcome) {
    let task = command
        .task
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    let pod = command
        .pod
        .as_ref()
        .map(|p| p.name.as_str())
        .unwrap_or_default();
    let (label, reason) = match outcome {
        Outcome::Applied(what) => ("applied", what.name()),
        Outcome::Skipped(skip) => ("skipped", skip.name()),
        Outcome::Dead(_) => ("dead", "refused"),
    };
    metrics::counter!(podstream_bus::metrics::SINK_COMMANDS, "outcome" => label, "reason" => reason)
        .increment(1);
    match outcome {
        Outcome::Applied(what) => {
            tracing::info!(ti = %task, pod, owner = %command.owner, command = %command.id, what = what.name(), "applied")
        }
        // A pod that is not its TI's is someone's copy of the TI's annotations: worth a look.
        Outcome::Skipped(skip @ Skip::ForeignPod) => {
            tracing::warn!(ti = %task, pod, owner = %command.owner, command = %command.id, reason = skip.name(), "skipped: the pod is not this task instance's")
        }
        Outcome::Skipped(skip) => {
            tracing::debug!(ti = %task, pod, owner = %command.owner, command = %command.id, reason = skip.name(), "skipped")
        }
        Outcome::Dead(_) => {}
    }
}

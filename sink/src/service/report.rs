//! What happens to each command once its lane has committed: its outcome logged and counted,
//! a refused one dead-lettered, and the message acked.

use podstream_bus::consume::{DeadLetters, ack, dead_letter};
use podstream_bus::in_flight::Held;
use podstream_proto::Command;

use crate::guard::Skip;
use crate::item::Outcome;
use crate::lanes::Applied;
use crate::summary::Summary;

/// What happens to each command once its lane has committed: dead letter, log, count, ack.
pub(super) async fn finish(dead: &DeadLetters, batch: Applied<Held>, summary: &mut Summary) {
    for (item, message, outcome) in batch {
        summary.add(&outcome);
        if let Outcome::Dead(reason) = outcome {
            tracing::warn!(command = %item.command.id, %reason, "command dead-lettered");
            dead_letter(dead, &message, item.sequence.unwrap_or(0), reason).await;
        } else {
            log_outcome(&item.command, &outcome);
            // Unacked means redelivered; the applied-command record makes that harmless.
            ack(&message).await;
        }
    }
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

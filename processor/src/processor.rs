//! The thin shell around the core: load the prior state, decide, store the
//! new state, log what matters.

use podstream_proto::{Command, PodEvent};
use thiserror::Error;
use tracing::{debug, warn};

use crate::decide::{Decision, EventError, decide, identity};
use crate::rules::{Ignored, Outcome, Rules};
use crate::state::StateStore;

/// Why an event could not be handled.
#[derive(Debug, Error)]
pub enum HandleError<E: std::error::Error + 'static> {
    /// The event itself is malformed: dead-letter it and go on.
    #[error(transparent)]
    Event(#[from] EventError),
    /// The state store failed: retry the event later.
    #[error("state store: {0}")]
    Store(#[source] E),
}

/// Feeds pod events through the rules, keeping state in a [`StateStore`].
#[derive(Debug)]
pub struct Processor<S> {
    rules: Rules,
    store: S,
}

impl<S: StateStore> Processor<S> {
    /// A processor applying `rules` with state in `store`.
    pub fn new(rules: Rules, store: S) -> Self {
        Processor { rules, store }
    }

    /// The state store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides one event and stores the new state; returns its commands.
    pub fn handle(&mut self, event: &PodEvent) -> Result<Vec<Command>, HandleError<S::Error>> {
        let (pod, key) = identity(event)?;
        let prior = self.store.load(&pod.uid, key).map_err(HandleError::Store)?;
        let applied = match decide(&self.rules, event, prior)? {
            Decision::Stale {
                last_resource_version,
            } => {
                debug!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner,
                    resource_version = %event.resource_version, %last_resource_version, "stale event, nothing to do");
                return Ok(Vec::new());
            }
            Decision::Applied(applied) => applied,
        };
        if let Outcome::Ignored(Ignored::UnknownPhase) = applied.outcome {
            warn!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner, phase = ?event.phase(),
                "pod in a phase the rules do not know; no task state change");
        }
        self.store
            .save(&pod.uid, &applied.pod, key, applied.task.as_ref())
            .map_err(HandleError::Store)?;
        for command in &applied.commands {
            let kind = command.kind.as_ref().map_or("none", |k| k.name());
            debug!(pod = %pod, uid = %pod.uid, ti = %key, owner = %command.owner, kind, id = %command.id, "command");
        }
        Ok(applied.commands)
    }
}

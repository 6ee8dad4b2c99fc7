//! The in-process shell around the core (`podstream decide`, replay, the tests): the task
//! record from a [`StateStore`], decided by [`TaskRecord::decide`] as the service decides
//! it, and what matters logged.
//!
//! [`TaskRecord::decide`]: crate::record::TaskRecord::decide

use podstream_proto::PodEvent;
use thiserror::Error;
use tracing::{debug, warn};

use crate::command::TaskCommand;
use crate::decide::{EventError, identity};
use crate::record::Recorded;
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

    /// Decides one event and stores the new state; returns its commands,
    /// which borrow from the event.
    pub fn handle<'e>(
        &mut self,
        event: &'e PodEvent,
    ) -> Result<Vec<TaskCommand<'e>>, HandleError<S::Error>> {
        let (pod, key) = identity(event)?;
        let rules = &self.rules;
        let recorded = self
            .store
            .update(key, |record| {
                record.decide(rules, event, pod, key, NO_SEQUENCE)
            })
            .map_err(HandleError::Store)?;
        let (outcome, commands) = match recorded {
            Recorded::Stale {
                last_resource_version,
            } => {
                debug!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner,
                    resource_version = %event.resource_version, %last_resource_version, "stale event, nothing to do");
                return Ok(Vec::new());
            }
            Recorded::Applied { outcome, commands } => (outcome, commands),
        };
        if let Outcome::Ignored(Ignored::UnknownPhase) = outcome {
            warn!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner, phase = ?event.phase(),
                "pod in a phase the rules do not know; no task state change");
        }
        for command in &commands {
            debug!(pod = %command.pod, uid = %command.pod.uid, ti = %key, owner = %command.owner,
                kind = command.kind.name(), id = %command.id(), "command");
        }
        Ok(commands)
    }
}

/// Events decided in process come from no stream: the record's per-pod sequence check
/// does not apply, only the resourceVersion order rule.
const NO_SEQUENCE: u64 = 0;

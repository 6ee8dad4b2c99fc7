//! The thin shell around the core: load the prior state, decide, store the
//! new state, log what matters.

use podstream_proto::PodEvent;
use thiserror::Error;
use tracing::{debug, warn};

use crate::command::TaskCommand;
use crate::decide::{Applied, Decision, EventError, decide_identified, identity};
use crate::rules::{Ignored, Outcome, Rules};
use crate::state::{Prior, StateStore};

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
        let decision = self
            .store
            .update(&pod.uid, key, |prior| {
                match decide_identified(rules, event, pod, key, prior) {
                    Decision::Stale { prior } => {
                        let last = prior.pod.as_ref().map(|p| p.resource_version.clone());
                        (prior, Err(last.unwrap_or_default()))
                    }
                    Decision::Applied(applied) => {
                        let Applied {
                            outcome,
                            pod,
                            task,
                            commands,
                        } = applied;
                        let next = Prior {
                            pod: Some(pod),
                            task,
                        };
                        (next, Ok((outcome, commands)))
                    }
                }
            })
            .map_err(HandleError::Store)?;
        let (outcome, commands) = match decision {
            Err(last_resource_version) => {
                debug!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner,
                    resource_version = %event.resource_version, %last_resource_version, "stale event, nothing to do");
                return Ok(Vec::new());
            }
            Ok(applied) => applied,
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

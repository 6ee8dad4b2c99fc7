//! What the processor remembers between events, and where it keeps it.
//!
//! Two records, both small and free of whole pods:
//! - per pod uid, a [`PodState`]: the last resourceVersion applied (the order
//!   rule) and the owner (transfers);
//! - per task instance key, a [`TaskState`]: the pods that map to it (duplicate
//!   resolution) and what each one has reported.

use std::collections::HashMap;
use std::convert::Infallible;

use podstream_proto::v1::{Phase, PodRef, TaskKey};

use crate::rules::Outcome;

/// The last applied facts of one pod.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodState {
    /// The task instance the pod runs.
    pub task: TaskKey,
    /// `airflow-worker` label value at the last applied event.
    pub owner: String,
    /// resourceVersion of the last applied event.
    pub resource_version: String,
    /// A `DELETED` event was applied: this is a tombstone that keeps the
    /// order rule working for late redeliveries.
    pub gone: bool,
}

/// The pods of one task instance.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TaskState {
    /// Every pod currently mapping to the TI, in no particular order.
    pub candidates: Vec<Candidate>,
    /// The last duplicate record emitted: chosen uid, then the others' uids
    /// sorted. `None` while the TI has one pod.
    pub duplicate_reported: Option<Vec<String>>,
    /// A pod reported a terminal outcome (fail, completed, lost) for this
    /// try: the try is over, no other pod of it reports again.
    pub settled: bool,
}

impl TaskState {
    /// The candidate entry of `uid`.
    pub fn candidate(&self, uid: &str) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.pod.uid == uid)
    }
}

/// One pod of a task instance, with the facts duplicate resolution needs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    /// The pod.
    pub pod: PodRef,
    /// `airflow-worker` label value now.
    pub owner: String,
    /// resourceVersion of its last applied event.
    pub resource_version: String,
    /// `status.phase` now.
    pub phase: Phase,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `metadata.creationTimestamp`, Unix milliseconds.
    pub created_unix_ms: i64,
    /// What its last event says about the TI.
    pub current: Outcome,
    /// The last outcome reported for it as a command, while it was chosen.
    pub reported: Option<Outcome>,
}

/// What the rules need to know before deciding one event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prior {
    /// The pod's last applied facts; `None` the first time it is seen.
    pub pod: Option<PodState>,
    /// The state of the TI the event names; `None` when no pod maps to it.
    pub task: Option<TaskState>,
}

/// Where the processor keeps its state between events.
///
/// In memory for `podstream decide` and unit tests; JetStream KV (with
/// compare-and-set) in the pipeline, so any instance can take over.
pub trait StateStore {
    /// Why the store could not load or save.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The prior state of pod `uid` and task `task`.
    fn load(&self, uid: &str, task: &TaskKey) -> Result<Prior, Self::Error>;

    /// Stores the state after an event; `task == None` removes the TI's
    /// record (no pod maps to it any more).
    fn save(
        &mut self,
        uid: &str,
        pod: &PodState,
        key: &TaskKey,
        task: Option<&TaskState>,
    ) -> Result<(), Self::Error>;
}

/// A [`StateStore`] in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    pods: HashMap<String, PodState>,
    tasks: HashMap<TaskKey, TaskState>,
}

impl MemoryStore {
    /// Number of pods and task instances remembered.
    pub fn len(&self) -> (usize, usize) {
        (self.pods.len(), self.tasks.len())
    }

    /// The state of task instance `key`, if any pod maps to it.
    pub fn task(&self, key: &TaskKey) -> Option<&TaskState> {
        self.tasks.get(key)
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty() && self.tasks.is_empty()
    }
}

impl StateStore for MemoryStore {
    type Error = Infallible;

    fn load(&self, uid: &str, task: &TaskKey) -> Result<Prior, Infallible> {
        Ok(Prior {
            pod: self.pods.get(uid).cloned(),
            task: self.tasks.get(task).cloned(),
        })
    }

    fn save(
        &mut self,
        uid: &str,
        pod: &PodState,
        key: &TaskKey,
        task: Option<&TaskState>,
    ) -> Result<(), Infallible> {
        self.pods.insert(uid.to_owned(), pod.clone());
        match task {
            Some(task) => {
                self.tasks.insert(key.clone(), task.clone());
            }
            None => {
                self.tasks.remove(key);
            }
        }
        Ok(())
    }
}

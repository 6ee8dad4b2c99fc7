//! What the processor remembers between events, and where it keeps it.
//!
//! Two records, both small and free of whole pods:
//! - per pod uid, a [`PodState`]: the last resourceVersion applied (the order
//!   rule) and the owner (transfers); it lives under its TI's entry, so it
//!   does not repeat the TI key;
//! - per task instance key, a [`TaskState`]: the pods that map to it (duplicate
//!   resolution) and what each one has reported.

use std::collections::HashMap;
use std::convert::Infallible;

use podstream_proto::v1::{Phase, PodRef, TaskKey};

use crate::rules::Outcome;

/// The last applied facts of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PodState {
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
    /// try: no pod seen so far reports again. A live pod new to the try after
    /// a fail or a loss (the executor's relaunch) opens it again.
    pub settled: bool,
    /// Uids of pods a relaunch replaced: they take no part in the try any more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<String>,
}

impl TaskState {
    /// Whether anything of this TI is left to remember: a pod mapping to it, or a retired
    /// pod not yet deleted.
    pub fn is_remembered(&self) -> bool {
        !self.candidates.is_empty() || !self.retired.is_empty()
    }

    /// A pod of this try reported that it completed: the task ran to its end.
    pub fn completed(&self) -> bool {
        self.candidates
            .iter()
            .any(|c| c.reported == Some(Outcome::Completed))
    }

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

impl Candidate {
    /// A fail or a loss was reported for this pod: a relaunch of the try retires it.
    pub fn out_of_play(&self) -> bool {
        matches!(self.reported, Some(Outcome::Fail(_) | Outcome::Lost { .. }))
    }
}

/// What the rules need to know before deciding one event; after it, the
/// same shape holds the state to keep for the next one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prior {
    /// The pod's last applied facts; `None` the first time it is seen.
    pub pod: Option<PodState>,
    /// The state of the TI the event names; `None` when no pod maps to it.
    pub task: Option<TaskState>,
}

/// Where the processor keeps its state between events.
///
/// In memory for `podstream decide` and unit tests; in the pipeline the
/// service keeps a [`TaskRecord`](crate::record::TaskRecord) per TI in
/// JetStream KV (with compare-and-set), so any instance can take over.
pub trait StateStore {
    /// Why the store could not load or save.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Hands the prior state of pod `uid` and task `task` to `change` and keeps
    /// the state it returns (`task == None` forgets the TI: no pod maps to it
    /// any more). State moves in and out, so nothing is copied.
    fn update<T>(
        &mut self,
        uid: &str,
        task: &TaskKey,
        change: impl FnOnce(Prior) -> (Prior, T),
    ) -> Result<T, Self::Error>;
}

/// The hasher of the in-memory maps: much cheaper than SipHash on the
/// short string keys (pod uids, TI keys) hashed on every event.
type FastHash = foldhash::fast::RandomState;

/// A [`StateStore`] in process memory: one entry per task instance holding
/// its state and its pods', as the pipeline's KV record does, so an event
/// costs one lookup.
#[derive(Debug, Default)]
pub struct MemoryStore {
    tasks: HashMap<TaskKey, TaskEntry, FastHash>,
}

/// What [`MemoryStore`] keeps for one task instance.
#[derive(Debug, Default)]
struct TaskEntry {
    /// Every pod that ever mapped to the TI (deleted ones as tombstones, for
    /// the order rule), by uid; nearly always one or two.
    pods: Vec<(String, PodState)>,
    /// The TI's state; `None` when no live pod maps to it.
    task: Option<TaskState>,
}

impl MemoryStore {
    /// Number of pods and task instances remembered.
    pub fn len(&self) -> (usize, usize) {
        let pods = self.tasks.values().map(|e| e.pods.len()).sum();
        let tasks = self.tasks.values().filter(|e| e.task.is_some()).count();
        (pods, tasks)
    }

    /// The state of task instance `key`, if any pod maps to it.
    pub fn task(&self, key: &TaskKey) -> Option<&TaskState> {
        self.tasks.get(key)?.task.as_ref()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

impl StateStore for MemoryStore {
    type Error = Infallible;

    fn update<T>(
        &mut self,
        uid: &str,
        key: &TaskKey,
        change: impl FnOnce(Prior) -> (Prior, T),
    ) -> Result<T, Infallible> {
        let entry = match self.tasks.get_mut(key) {
            Some(entry) => entry,
            None => self.tasks.entry(key.clone()).or_default(),
        };
        // Move the state out of its slots and back in: no copies.
        let at = entry.pods.iter().position(|(u, _)| u == uid);
        let prior = Prior {
            pod: at.map(|at| std::mem::take(&mut entry.pods[at].1)),
            task: entry.task.take(),
        };
        let (next, result) = change(prior);
        match (at, next.pod) {
            (Some(at), Some(pod)) => entry.pods[at].1 = pod,
            (None, Some(pod)) => entry.pods.push((uid.to_owned(), pod)),
            (Some(at), None) => {
                entry.pods.swap_remove(at);
            }
            (None, None) => {}
        }
        entry.task = next.task;
        Ok(result)
    }
}

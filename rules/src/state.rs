//! What the processor remembers between events (the records that hold it are
//! [`crate::record`]'s).
//!
//! Two records, both small and free of whole pods:
//! - per pod uid, a [`PodState`]: the last resourceVersion applied (the order
//!   rule) and the owner (transfers); it lives under its TI's entry, so it
//!   does not repeat the TI key;
//! - per task instance key, a [`TaskState`]: the pods that map to it (duplicate
//!   resolution) and what each one has reported.

use podstream_proto::v1::{Phase, PodRef};

use crate::table::Outcome;

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
    /// try: no pod seen so far reports again. A live pod new to the try (the
    /// executor's relaunch, or the real pod after a copy ended) opens it again.
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
    /// The TI UUID its `task_instance_id` annotation names; empty when it names none. Pods of
    /// one key compete whatever their UUID; the sink checks it against the TI row.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_instance_id: String,
    /// It ended (fail, completed, lost) while another pod drove the TI, so its ending was
    /// judged not to be the TI's: it never drives the try afterwards, even once the pod that
    /// drove it has ended too (a losing pod's failure never fails the task).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub passed_over: bool,
}

impl Candidate {
    /// An ending (fail, loss, completion) was reported for this pod: a pod new to the try
    /// retires it.
    pub fn out_of_play(&self) -> bool {
        self.reported.as_ref().is_some_and(Outcome::is_terminal)
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

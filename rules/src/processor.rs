//! The in-process shell around the core (`podstream decide`, replay, the tests): the task
//! record from a [`StateStore`], decided by [`TaskRecord::decide`] as the service decides
//! it, and what matters logged.
//!
//! [`TaskRecord::decide`]: crate::record::TaskRecord::decide

use std::convert::Infallible;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use podstream_proto::signature::Unsigned;
use podstream_proto::v1::TaskKey;
use podstream_proto::{PodEvent, PodRef};
use thiserror::Error;
use tracing::{debug, warn};

use crate::command::TaskCommand;
use crate::decide::{EventError, identity};
use crate::record::{RecordKey, Recorded, TaskRecord};
use crate::state::TaskState;
use crate::table::{Ignored, Outcome, Rules};

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
                match record.decide(rules, event, pod, key, NO_SEQUENCE) {
                    Recorded::Stale => Err(record
                        .pod(&pod.uid)
                        .map(|p| p.state.resource_version.clone())
                        .unwrap_or_default()),
                    Recorded::Applied { outcome, commands } => Ok((outcome, commands)),
                }
            })
            .map_err(HandleError::Store)?;
        let (outcome, commands) = match recorded {
            Err(last_resource_version) => {
                debug!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner,
                    resource_version = %event.resource_version, %last_resource_version, "stale event, nothing to do");
                return Ok(Vec::new());
            }
            Ok(applied) => applied,
        };
        match outcome {
            Outcome::Ignored(Ignored::UnknownPhase) => {
                warn!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner, phase = ?event.phase(),
                    "pod in a phase the rules do not know; no task state change");
            }
            Outcome::Ignored(Ignored::Unsigned(reason)) => warn_unsigned(event, pod, key, reason),
            _ => {}
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

/// Where the processor keeps its task records between events.
///
/// In memory for `podstream decide`, replay and the tests ([`MemoryStore`]); the service
/// keeps the same [`TaskRecord`] per TI in JetStream KV (with compare-and-set), so any
/// instance can take over. Either way an event is decided by [`TaskRecord::decide`].
pub trait StateStore {
    /// Why the store could not load or save.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Hands the record of task instance `task` (an empty one when there is none yet) to
    /// `change`, and keeps it as `change` left it.
    fn update<T>(
        &mut self,
        task: &TaskKey,
        change: impl FnOnce(&mut TaskRecord) -> T,
    ) -> Result<T, Self::Error>;
}

/// The hasher of the in-memory maps: much cheaper than SipHash on the
/// short string keys (TI keys) hashed on every event.
type FastHash = foldhash::fast::RandomState;

/// Finished task instances (every pod deleted) a [`MemoryStore`] keeps, by default.
pub const DEFAULT_FINISHED_TASKS: usize = 10_000;

/// A [`StateStore`] in process memory: the pipeline's KV record of each task instance, so
/// an event costs one lookup. A finished task instance (every pod it had is deleted) is
/// kept for late repeats of its events only as long as it is among the last
/// `DEFAULT_FINISHED_TASKS` to finish: a deleted pod is never listed again, so only a
/// replayed input can bring its events back, and those are decided again with the same
/// command ids, which the sink skips. So memory follows the live task instances, not
/// everything ever seen.
#[derive(Debug)]
pub struct MemoryStore {
    /// Each record boxed with its key, so a slot of the table is a pointer: the table is a
    /// few bytes per task instance, and growing it moves pointers, never records.
    records: HashTable<Box<(TaskKey, TaskRecord)>>,
    hasher: FastHash,
    /// Finished task instances, oldest first.
    finished: hashlink::LinkedHashSet<TaskKey, FastHash>,
    finished_limit: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::keeping_finished(DEFAULT_FINISHED_TASKS)
    }
}

impl MemoryStore {
    /// A store that keeps at most `limit` finished task instances.
    pub fn keeping_finished(limit: usize) -> MemoryStore {
        MemoryStore {
            records: HashTable::new(),
            hasher: FastHash::default(),
            finished: hashlink::LinkedHashSet::default(),
            finished_limit: limit,
        }
    }

    /// Number of pods and task instances remembered.
    pub fn len(&self) -> (usize, usize) {
        let pods = self.records.iter().map(|entry| entry.1.pods.len()).sum();
        let tasks = self
            .records
            .iter()
            .filter(|entry| entry.1.task.is_some())
            .count();
        (pods, tasks)
    }

    /// Number of task instance records held, finished ones included.
    pub fn records(&self) -> usize {
        self.records.len()
    }

    /// The state of task instance `key`, if any pod maps to it.
    pub fn task(&self, key: &TaskKey) -> Option<&TaskState> {
        let hash = self.hasher.hash_one(RecordKey(key));
        self.records
            .find(hash, |entry| RecordKey(&entry.0) == RecordKey(key))?
            .1
            .task
            .as_ref()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// Logs an event whose pod is foreign for want of a valid signature, as every shell does.
pub fn warn_unsigned(event: &PodEvent, pod: &PodRef, key: &TaskKey, reason: Unsigned) {
    warn!(pod = %pod, uid = %pod.uid, ti = %key, owner = %event.owner, reason = reason.name(),
        "pod without a valid signature: foreign, it drives nothing");
}

/// `key` without the UUID its pod named: the key a record is stored under.
fn record_key(key: &TaskKey) -> TaskKey {
    TaskKey {
        task_instance_id: String::new(),
        ..key.clone()
    }
}

/// Whether every pod the record has known is deleted and none maps to the TI any more.
fn finished(record: &TaskRecord) -> bool {
    record.task.is_none()
        && !record.pods.is_empty()
        && record.pods.iter().all(|(_, pod)| pod.state.gone)
}

impl StateStore for MemoryStore {
    type Error = Infallible;

    fn update<T>(
        &mut self,
        key: &TaskKey,
        change: impl FnOnce(&mut TaskRecord) -> T,
    ) -> Result<T, Infallible> {
        let hasher = &self.hasher;
        let hash = hasher.hash_one(RecordKey(key));
        let entry = match self.records.entry(
            hash,
            |entry| RecordKey(&entry.0) == RecordKey(key),
            |entry| hasher.hash_one(RecordKey(&entry.0)),
        ) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => entry
                .insert(Box::new((record_key(key), TaskRecord::default())))
                .into_mut(),
        };
        let key = &entry.0;
        let record = &mut entry.1;
        // Only records that finish or come back touch the set: a live TI's event costs nothing.
        let was_finished = finished(record);
        let result = change(record);
        match (was_finished, finished(record)) {
            (false, true) => {
                self.finished.insert(key.clone());
                while self.finished.len() > self.finished_limit {
                    if let Some(oldest) = self.finished.pop_front() {
                        let hash = self.hasher.hash_one(RecordKey(&oldest));
                        if let Ok(entry) = self
                            .records
                            .find_entry(hash, |entry| RecordKey(&entry.0) == RecordKey(&oldest))
                        {
                            entry.remove();
                        }
                    }
                }
            }
            (true, false) => {
                self.finished.remove(key);
            }
            _ => {}
        }
        Ok(result)
    }
}

//! What the processor service keeps in JetStream KV for one task instance, and how one event
//! changes it. Pure: the service loads a record, calls [`TaskRecord::apply`], and writes it
//! back with compare-and-set.
//!
//! One record per TI holds the TI's state *and* the state of each of its pods, so deciding an
//! event is one read and one compare-and-set write: two processors deciding events of two pods
//! of the same TI can never interleave their updates. A pod's state also carries the stream
//! sequence of its last decided event, which is how an instance finds earlier events of the
//! pod that another instance has not decided yet (per-pod order across instances).

use std::collections::BTreeMap;

use podstream_proto::PodEvent;
use podstream_proto::subject::encode_key_token;
use podstream_proto::v1::{Command, PodRef, TaskKey};
use serde::{Deserialize, Serialize};

use crate::command::TaskCommand;
use crate::decide::{Decision, EventError, decide_identified, identity};
use crate::state::{PodState, Prior, TaskState};
use crate::table::{Outcome, Rules};

/// The most deleted pods a task record remembers (the newest by stream sequence).
pub const MAX_TOMBSTONES: usize = 16;

/// The KV entry of one task instance.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Every pod that ever mapped to the TI, deleted ones as tombstones, by uid: nearly
    /// always one or two, so a list (a map's first node alone is a kilobyte, which the
    /// service's record cache would hold per TI). A JSON object on the wire.
    #[serde(with = "by_uid")]
    pub pods: Vec<(String, PodRecord)>,
    /// The TI's state; `None` when no live pod maps to it.
    pub task: Option<TaskState>,
    /// The commands of the last write, kept until a later write: whoever loads the record
    /// publishes them again (deduplicated by `Nats-Msg-Id`), so a processor that died
    /// between its write and its publish loses nothing.
    pub outbox: Vec<Command>,
}

/// A TI key as the identity of its record: every field but the UUID a pod names, so pods of
/// one key compete under the duplicate rule whatever UUID they claim.
#[derive(Debug, Clone, Copy)]
pub struct RecordKey<'a>(pub &'a TaskKey);

impl PartialEq for RecordKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0, other.0);
        a.dag_id == b.dag_id
            && a.task_id == b.task_id
            && a.run_id == b.run_id
            && a.logical_date == b.logical_date
            && a.map_index == b.map_index
            && a.try_number == b.try_number
    }
}

impl Eq for RecordKey<'_> {}

impl std::hash::Hash for RecordKey<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let key = self.0;
        key.dag_id.hash(state);
        key.task_id.hash(state);
        key.run_id.hash(state);
        key.logical_date.hash(state);
        key.map_index.hash(state);
        key.try_number.hash(state);
    }
}

/// What deciding one event did to a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded<'e> {
    /// Not newer than what the record holds for its pod: nothing changed.
    Stale,
    /// Decided and recorded.
    Applied {
        /// What the event says about its TI, before duplicate resolution.
        outcome: Outcome,
        /// The commands, in the order they must be applied.
        commands: Vec<TaskCommand<'e>>,
    },
}

/// One pod of the TI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    /// Its state for the rules.
    pub state: PodState,
    /// Stream sequence of its last decided event.
    pub sequence: u64,
}

impl TaskRecord {
    /// The KV key of task instance `task`: `ti.<dag>.<task>.<run>.<map index>.<try>`, each
    /// token escaped to the characters KV keys allow. The UUID a pod names is not part of
    /// it: pods of one key compete in one record whatever UUID they claim, and the sink
    /// checks the UUID against the TI row (a forged pod cannot open a record of its own).
    pub fn key(task: &TaskKey) -> String {
        let run = if task.is_complete() {
            &task.run_id
        } else {
            &task.logical_date
        };
        format!(
            "ti.{}.{}.{}.{}.{}",
            encode_key_token(&task.dag_id),
            encode_key_token(&task.task_id),
            encode_key_token(run),
            task.map_index,
            task.try_number
        )
    }

    /// Stream sequence of the last decided event of pod `uid`; 0 when none was.
    pub fn last_sequence(&self, uid: &str) -> u64 {
        self.pod(uid).map_or(0, |p| p.sequence)
    }

    /// The record of pod `uid`, if it ever mapped to this TI.
    pub fn pod(&self, uid: &str) -> Option<&PodRecord> {
        self.pods.iter().find(|(u, _)| u == uid).map(|(_, p)| p)
    }

    fn pod_mut(&mut self, uid: &str) -> Option<&mut PodRecord> {
        self.pods.iter_mut().find(|(u, _)| u == uid).map(|(_, p)| p)
    }

    /// Decides `event`, found at stream `sequence`, and records the result; returns the
    /// commands. An event already decided (sequence not past the pod's last) changes nothing.
    pub fn apply(
        &mut self,
        rules: &Rules,
        event: &PodEvent,
        sequence: u64,
    ) -> Result<Vec<Command>, EventError> {
        self.apply_noting(rules, event, sequence)
            .map(|(commands, _)| commands)
    }

    /// [`TaskRecord::apply`], handing back the event's outcome too (`None` when the event
    /// changed nothing), for a shell that reports on it.
    pub fn apply_noting(
        &mut self,
        rules: &Rules,
        event: &PodEvent,
        sequence: u64,
    ) -> Result<(Vec<Command>, Option<Outcome>), EventError> {
        let (pod, key) = identity(event)?;
        Ok(match self.decide(rules, event, pod, key, sequence) {
            Recorded::Stale => (Vec::new(), None),
            Recorded::Applied { commands, outcome } => (
                commands
                    .into_iter()
                    .map(TaskCommand::into_command)
                    .collect(),
                Some(outcome),
            ),
        })
    }

    /// Decides `event` of `pod` (whose [`identity`] the caller read), found at stream
    /// `sequence` (0 where there is no stream: `decide`, replay, tests), and records the
    /// result. The commands borrow from the event. Every shell (the service, `podstream
    /// decide`, the tests) decides through here.
    pub fn decide<'e>(
        &mut self,
        rules: &Rules,
        event: &'e PodEvent,
        pod: &'e PodRef,
        key: &'e TaskKey,
        sequence: u64,
    ) -> Recorded<'e> {
        let uid = pod.uid.as_str();
        if sequence != 0 && sequence <= self.last_sequence(uid) {
            return Recorded::Stale;
        }
        // The state moves out of the record and back: nothing is copied.
        let prior = Prior {
            pod: self.pod_mut(uid).map(|p| std::mem::take(&mut p.state)),
            task: self.task.take(),
        };
        match decide_identified(rules, event, pod, key, prior) {
            Decision::Stale { prior } => {
                self.task = prior.task;
                if let Some(record) = self.pod_mut(uid) {
                    if let Some(state) = prior.pod {
                        record.state = state;
                    }
                    record.sequence = record.sequence.max(sequence);
                }
                Recorded::Stale
            }
            Decision::Applied(applied) => {
                let record = PodRecord {
                    state: applied.pod,
                    sequence,
                };
                match self.pod_mut(uid) {
                    Some(known) => *known = record,
                    None => self.pods.push((uid.to_owned(), record)),
                }
                self.prune_tombstones();
                self.task = applied.task;
                Recorded::Applied {
                    outcome: applied.outcome,
                    commands: applied.commands,
                }
            }
        }
    }

    /// Drops the oldest deleted pods' tombstones beyond [`MAX_TOMBSTONES`]: a TI that many
    /// copies of its pod were made for keeps a bounded record. A tombstone only guards against
    /// a late redelivery of its pod's events, which the oldest are least likely to see.
    fn prune_tombstones(&mut self) {
        let mut gone: Vec<(u64, usize)> = (self.pods.iter().enumerate())
            .filter(|(_, (_, p))| p.state.gone)
            .map(|(at, (_, p))| (p.sequence, at))
            .collect();
        if gone.len() <= MAX_TOMBSTONES {
            return;
        }
        // Oldest first: by stream sequence, then (in process, where there is none) as seen.
        gone.sort_unstable();
        let dropped: Vec<usize> = gone[..gone.len() - MAX_TOMBSTONES]
            .iter()
            .map(|(_, at)| *at)
            .collect();
        let mut at = 0;
        self.pods.retain(|_| {
            let keep = !dropped.contains(&at);
            at += 1;
            keep
        });
    }

    /// Serializes the record (JSON, readable with `nats kv get`).
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// Reads a record written by [`TaskRecord::encode`].
    pub fn decode(bytes: &[u8]) -> Result<TaskRecord, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// `TaskRecord::pods` as a JSON object keyed by uid (the KV form other tools read).
mod by_uid {
    use super::{BTreeMap, PodRecord};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        pods: &[(String, PodRecord)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(pods.iter().map(|(uid, pod)| (uid, pod)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<(String, PodRecord)>, D::Error> {
        Ok(BTreeMap::<String, PodRecord>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn pods_are_a_json_object_by_uid_as_records_have_always_been_written() {
        let written = r#"{"pods":{"u1":{"state":{"owner":"1","resource_version":"5","gone":false},"sequence":7},"u2":{"state":{"owner":"2","resource_version":"9","gone":true},"sequence":11}},"task":null,"outbox":[]}"#;
        let record = TaskRecord::decode(written.as_bytes()).unwrap();
        assert_eq!(record.last_sequence("u1"), 7);
        assert_eq!(record.last_sequence("u2"), 11);
        assert_eq!(record.last_sequence("u3"), 0);
        let again = String::from_utf8(record.encode().unwrap()).unwrap();
        assert_eq!(again, written);
    }

    #[test]
    fn keys_use_only_kv_key_characters_and_stay_distinct() {
        let cases = [
            ("etl", "load", "manual__2024-01-01T00:00:00+00:00", -1, 1),
            ("etl.v2", "load", "r", 3, 2),
            ("etl", "v2.load", "r", 3, 2),
            ("dag with spaces", "tâche", "", 0, 1),
        ];
        let mut seen = std::collections::HashSet::new();
        for (dag_id, task_id, run_id, map_index, try_number) in cases {
            let key = TaskRecord::key(&TaskKey {
                dag_id: dag_id.into(),
                task_id: task_id.into(),
                run_id: run_id.into(),
                map_index,
                try_number,
                logical_date: String::new(),
                task_instance_id: String::new(),
            });
            assert!(
                key.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=.".contains(&b)),
                "{key}"
            );
            assert_eq!(key.split('.').count(), 6, "{key}");
            assert!(seen.insert(key.clone()), "{key} twice");
        }
    }

    #[test]
    fn pods_naming_any_task_instance_id_share_the_key() {
        let names = TaskKey {
            dag_id: "etl".into(),
            task_id: "load".into(),
            run_id: "r".into(),
            map_index: -1,
            try_number: 1,
            ..TaskKey::default()
        };
        let with_id = |id: &str| TaskKey {
            task_instance_id: id.into(),
            ..names.clone()
        };
        let a = TaskRecord::key(&with_id("0196b3a0-0000-7000-8000-000000000001"));
        let b = TaskRecord::key(&with_id("0196b3a0-0000-7000-8000-000000000002"));
        assert_eq!(a, "ti.etl.load.r.-1.1");
        assert_eq!(a, b);
        assert_eq!(a, TaskRecord::key(&names));
        assert!(RecordKey(&with_id("x")) == RecordKey(&names));
        let hash =
            |key: &TaskKey| foldhash::quality::FixedState::default().hash_one(RecordKey(key));
        assert_eq!(hash(&with_id("x")), hash(&names));
    }
}

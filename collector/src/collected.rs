//! What the collector did to one pod: the value of its entry in the bucket of pods collected
//! (`<prefix>-collect`, key `pod.<uid>`), which `tail` and `replay` show.

use std::fmt;

use podstream_proto::subject::{Subjects, encode_key_token};
use podstream_proto::v1::{PodRef, TaskKey};
use serde::{Deserialize, Serialize};

use crate::pods::Answer;
use crate::rule::Reason;

/// What the collector did to a pod: the `action` label of its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Deleted it.
    Deleted,
    /// Labelled it `airflow_executor_done=True` (`delete_worker_pods` off).
    LabelledDone,
}

impl Action {
    /// The metric label, log field and entry value.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Deleted => "deleted",
            Action::LabelledDone => "labelled_done",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One pod collected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collected {
    /// The pod.
    pub pod: PodRef,
    /// Its task instance.
    pub ti: TaskKey,
    /// Why.
    pub reason: Reason,
    /// What was done.
    pub action: Action,
    /// What the API server answered: `done`, `gone` (404), `replaced` (another pod has the
    /// name now).
    pub answer: Answer,
    /// For a duplicate, the pod that drives its task instance; for a stale pod, the later
    /// try's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<PodRef>,
}

/// The role in the name of a prefix's bucket of pods collected (`<prefix>-collect`).
pub const BUCKET_ROLE: &str = "collect";

/// The subjects of the entries of the bucket of pods collected under `subjects`' prefix
/// (`$KV.<prefix>-collect.>`), which `tail` subscribes to.
pub fn entry_filter(subjects: &Subjects) -> String {
    format!("$KV.{}.>", subjects.resource_name(BUCKET_ROLE))
}

/// Whether `subject` is an entry of the bucket of pods collected under `subjects`' prefix.
pub fn is_entry(subjects: &Subjects, subject: &str) -> bool {
    subject
        .strip_prefix("$KV.")
        .and_then(|rest| rest.strip_prefix(&subjects.resource_name(BUCKET_ROLE)))
        .is_some_and(|rest| rest.starts_with('.'))
}

/// The key of pod `uid` in the bucket: `pod.<uid>`, the uid encoded as one key token.
pub fn key(uid: &str) -> String {
    format!("pod.{}", encode_key_token(uid))
}

impl Collected {
    /// The entry's JSON.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// An entry's JSON read back.
    pub fn decode(bytes: &[u8]) -> Result<Collected, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_prefixs_own_bucket_holds_pods_collected() {
        let subjects = Subjects::new("podstream").unwrap();
        assert_eq!(entry_filter(&subjects), "$KV.podstream-collect.>");
        assert!(is_entry(&subjects, "$KV.podstream-collect.pod.1234"));
        assert!(!is_entry(&subjects, "$KV.podstream-process.ti.x"));
        assert!(!is_entry(&subjects, "$KV.podstream-collected.pod.1"));
        let other = Subjects::new("airflow-b").unwrap();
        assert!(!is_entry(&other, "$KV.podstream-collect.pod.1234"));
    }

    #[test]
    fn any_uid_is_one_key_token() {
        assert_eq!(key("0b5c-11"), "pod.0b5c-11");
        assert_eq!(key("a.b*"), "pod.a=2Eb=2A");
        assert_eq!(key(""), "pod.=");
    }

    #[test]
    fn an_entry_reads_back_with_its_closed_sets_as_words() {
        let collected = Collected {
            pod: PodRef {
                namespace: "airflow".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            ti: TaskKey::default(),
            reason: Reason::Duplicate,
            action: Action::LabelledDone,
            answer: Answer::Gone,
            driver: None,
        };
        let json: serde_json::Value = serde_json::from_slice(&collected.encode()).unwrap();
        assert_eq!(json["reason"], "duplicate");
        assert_eq!(json["action"], "labelled_done");
        assert_eq!(json["answer"], "gone");
        assert_eq!(Collected::decode(&collected.encode()).unwrap(), collected);
        assert_eq!(format!("{:<10}|", Reason::Stale), "stale     |");
    }
}

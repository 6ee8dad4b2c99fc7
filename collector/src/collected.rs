//! What the collector did to one pod: the value of its entry in the bucket of pods collected
//! (`<prefix>-collect`, key `pod.<uid>`), which `tail` and `replay` show.

use podstream_proto::v1::{PodRef, TaskKey};
use serde::{Deserialize, Serialize};

/// One pod collected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collected {
    /// The pod.
    pub pod: PodRef,
    /// Its task instance.
    pub ti: TaskKey,
    /// `finished`, `duplicate` or `stale`.
    pub reason: String,
    /// `deleted` or `labelled_done`.
    pub action: String,
    /// What the API server answered: `done`, `gone` (404), `replaced` (another pod has the
    /// name now).
    pub answer: String,
    /// For a duplicate, the pod that drives its task instance; for a stale pod, the later
    /// try's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<PodRef>,
}

/// The key of pod `uid` in the bucket: `pod.<uid>`, when the uid fits a KV key.
pub fn key(uid: &str) -> Option<String> {
    let fits = !uid.is_empty()
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    fits.then(|| format!("pod.{uid}"))
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

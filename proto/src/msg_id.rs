//! Every `Nats-Msg-Id` podstream writes, made here and nowhere else.
//!
//! JetStream stores a message once per id inside a stream's duplicate window, so an id names
//! the fact a message states, never the moment it was sent: a re-publish after a crash, a
//! re-list or a replay is then stored once. docs/contract.md lists the forms.

use crate::subject::{Role, Stage};

/// The id of the command of `kind` decided from one pod event, also the sink's
/// applied-command key.
///
/// One event yields at most one command of each kind, so the pod's uid, the event's
/// resourceVersion and the kind's name identify it; deciding the same event again (a
/// replay, a second processor) gives the same id.
///
/// ```
/// use podstream_proto::msg_id;
/// assert_eq!(msg_id::command("6f1c", "1042", "fail"), "6f1c:1042:fail");
/// ```
pub fn command(pod_uid: &str, resource_version: &str, kind: &str) -> String {
    // Built by hand: one allocation, no formatting machinery (one id per command).
    let mut id = String::with_capacity(pod_uid.len() + resource_version.len() + kind.len() + 2);
    id.push_str(pod_uid);
    id.push(':');
    id.push_str(resource_version);
    id.push(':');
    id.push_str(kind);
    id
}

/// The id of the copy of a message for the pod's previous owner (a relabel's `left` notice,
/// a transfer's copy), from the id of the message itself.
///
/// ```
/// use podstream_proto::msg_id;
/// assert_eq!(msg_id::left_copy("6f1c:1042:transfer"), "6f1c:1042:transfer:left");
/// ```
pub fn left_copy(id: &str) -> String {
    format!("{id}:{}", Role::Left.as_str())
}

/// What a watch event says of its object: that it changed (`ADDED` and `MODIFIED` alike:
/// whether a revision is a first sighting depends on who saw it, not on the fact) or that it
/// is gone.
fn change(deleted: bool) -> &'static str {
    if deleted { "deleted" } else { "changed" }
}

/// The id of a pod event: the pod's uid, the resourceVersion, and whether it was deleted.
///
/// ```
/// use podstream_proto::msg_id;
/// assert_eq!(msg_id::pod_event("6f1c", "1042", false), "6f1c:1042:changed");
/// assert_eq!(msg_id::pod_event("6f1c", "1050", true), "6f1c:1050:deleted");
/// ```
pub fn pod_event(uid: &str, resource_version: &str, deleted: bool) -> String {
    format!("{uid}:{resource_version}:{}", change(deleted))
}

/// The id of a Spark event (a driver pod's or a SparkApplication's).
///
/// ```
/// use podstream_proto::msg_id;
/// assert_eq!(msg_id::spark_event("a1", "7", true), "spark:a1:7:deleted");
/// ```
pub fn spark_event(uid: &str, resource_version: &str, deleted: bool) -> String {
    format!("spark:{uid}:{resource_version}:{}", change(deleted))
}

/// The id of the dead letter of a pod the ingest could not use, for `reason`: one per pod
/// and reason, whatever revision shows it again (the reason as a short SHA-256, since it may
/// quote a long value).
///
/// ```
/// use podstream_proto::msg_id;
/// let id = msg_id::dead_pod("6f1c", "pod has no `dag_id` annotation");
/// assert!(id.starts_with("6f1c:dead:") && id.len() == "6f1c:dead:".len() + 16);
/// assert_eq!(id, msg_id::dead_pod("6f1c", "pod has no `dag_id` annotation"));
/// assert_ne!(id, msg_id::dead_pod("6f1c", "pod has no `task_id` annotation"));
/// ```
pub fn dead_pod(uid: &str, reason: &str) -> String {
    use sha2::Digest as _;
    use std::fmt::Write as _;
    let digest = sha2::Sha256::digest(reason.as_bytes());
    let mut id = format!("{uid}:dead:");
    for byte in &digest[..8] {
        let _ = write!(id, "{byte:02x}");
    }
    id
}

/// The id of the dead letter of a Spark object the ingest could not use.
///
/// ```
/// use podstream_proto::msg_id;
/// assert_eq!(msg_id::dead_spark_object("a1", "7"), "spark:a1:7:dead");
/// ```
pub fn dead_spark_object(uid: &str, resource_version: &str) -> String {
    format!("spark:{uid}:{resource_version}:dead")
}

/// The id of the dead letter of a message a stage's consumer could not use: its stage, the
/// subject and stream sequence it came from (a redelivery of it is stored once).
///
/// ```
/// use podstream_proto::msg_id;
/// use podstream_proto::subject::Stage;
/// assert_eq!(
///     msg_id::dead_message(Stage::Sink, "podstream.commands.1.6f1c", 42),
///     "sink:podstream.commands.1.6f1c:42"
/// );
/// ```
pub fn dead_message(stage: Stage, subject: &str, sequence: u64) -> String {
    format!("{}:{subject}:{sequence}", stage.token())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of message has its own id space: no two forms can give the same id.
    #[test]
    fn ids_of_different_facts_differ() {
        let ids = [
            command("u", "7", "fail"),
            command("u", "7", "transfer"),
            command("u", "8", "fail"),
            left_copy(&command("u", "7", "fail")),
            pod_event("u", "7", false),
            pod_event("u", "7", true),
            left_copy(&pod_event("u", "7", false)),
            spark_event("u", "7", false),
            dead_pod("u", "7"),
            dead_spark_object("u", "7"),
            dead_message(Stage::Sink, "s", 7),
            dead_message(Stage::Processor, "s", 7),
        ];
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
    }

    #[test]
    fn the_same_fact_gives_the_same_id() {
        assert_eq!(command("u", "7", "fail"), command("u", "7", "fail"));
        assert_eq!(pod_event("u", "7", true), pod_event("u", "7", true));
    }
}

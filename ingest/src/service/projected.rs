//! A watched pod as what is published for it: its event, or the dead letter it becomes.

use bytes::Bytes;
use podstream_bus::dead::DeadLetter;
use podstream_proto::PodEvent;
use podstream_proto::msg_id;
use podstream_proto::subject::Subjects;
use podstream_proto::v1::EventType;

use crate::watched_pod::WatchedPod;

/// A pod as projected: its event, or the dead letter it becomes.
pub(super) enum Projected {
    /// Its event.
    Event(Box<PodEvent>),
    /// Why it cannot be used.
    Unusable(Box<DeadLetter>),
}

/// A watched pod's event of `kind`, or its dead letter.
pub(super) fn project(subjects: &Subjects, kind: EventType, pod: WatchedPod) -> Projected {
    match pod.into_event(kind) {
        Ok(event) => Projected::Event(Box::new(event)),
        Err(unusable) => {
            let meta = unusable.metadata;
            let name = meta.name.unwrap_or_default();
            let namespace = meta.namespace.unwrap_or_default();
            let uid = meta.uid.unwrap_or_default();
            let rv = meta.resource_version.unwrap_or_default();
            let reason = unusable.reason;
            tracing::warn!(pod = %name, namespace = %namespace, uid = %uid, %reason, "unusable pod; dead-lettered");
            Projected::Unusable(Box::new(DeadLetter::of_object(
                subjects,
                msg_id::dead_pod(&uid, &reason),
                format!("pod {namespace}/{name} uid {uid} resourceVersion {rv}"),
                reason,
                Bytes::from(crate::dead_pod::kept(unusable.raw.get())),
            )))
        }
    }
}

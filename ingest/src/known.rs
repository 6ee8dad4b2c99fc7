//! What the ingest knows of each pod, and what it publishes when it sees one: the pure core of
//! the ingest, table-tested in `tests/known.rs`.
//!
//! Per pod it keeps the last `PodEvent` it published (owner, resourceVersion, the facts the
//! rules read), never the `Pod`. From that it decides:
//! - a pod seen again at a revision already published, or an older one → nothing (re-lists,
//!   restarts, the history replay overlapping the watch);
//! - a pod whose owner changed → the event on the new owner's subject and a `left` notice on
//!   the old owner's subject;
//! - after a re-list, a known pod that was not listed → a synthesized `DELETED`.
//!
//! Each event also says where the pod's previous event sits in the stream
//! (`previous_sequence`) when the ingest can vouch for it: the sequence its ack returned, or
//! 0 for a pod first seen by a live watch. The processor then skips searching the stream for
//! earlier undecided events of the pod.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;

use bytes::Bytes;
use podstream_proto::PodEvent;
use podstream_proto::msg_id;
use podstream_proto::revision::is_newer;
use podstream_proto::subject::Subjects;
use podstream_proto::v1::EventType;
use prost::Message as _;

pub use podstream_proto::subject::{ROLE_HEADER, Role};

/// One message for the pod-events stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// `podstream.pods.<owner>.<uid>`.
    pub subject: String,
    /// `Nats-Msg-Id`: `<uid>:<resourceVersion>:<changed|deleted>[:left]`.
    pub msg_id: String,
    /// Event or notice.
    pub role: Role,
    /// The event.
    pub event: PodEvent,
    /// The event encoded once, for the bus and the checkpoint.
    pub payload: Bytes,
}

impl Outgoing {
    /// The JetStream message: payload, `Nats-Msg-Id` and the role header.
    pub fn to_publish(&self) -> async_nats::jetstream::message::PublishMessage {
        async_nats::jetstream::message::PublishMessage::build()
            .headers(podstream_bus::role::headers(self.role))
            .payload(self.payload.clone())
            .message_id(&self.msg_id)
    }
}

/// The deterministic message id of an event: the same fact always gets the same id, so
/// JetStream drops a re-publish inside its duplicate window.
///
/// `ADDED` and `MODIFIED` share the kind `changed`: whether a revision is a pod's first
/// sighting depends on who saw it (a watch, a re-list, a replay), not on the fact.
pub fn msg_id(event: &PodEvent, role: Role) -> String {
    let uid = event.pod.as_ref().map_or("", |p| p.uid.as_str());
    let id = msg_id::pod_event(
        uid,
        &event.resource_version,
        event.r#type() == EventType::Deleted,
    );
    match role {
        Role::Event => id,
        Role::Left => msg_id::left_copy(&id),
    }
}

/// The uid of an event's pod ("" when absent, which projection never produces).
pub fn uid(event: &PodEvent) -> &str {
    event.pod.as_ref().map_or("", |p| p.uid.as_str())
}

fn namespace(event: &PodEvent) -> &str {
    event.pod.as_ref().map_or("", |p| p.namespace.as_str())
}

/// What is kept per pod: what the decisions read, plus the last event encoded (a third of
/// the memory of a decoded `PodEvent`, which matters at 100k pods).
#[derive(Debug, Clone)]
struct Last {
    owner: String,
    rv: String,
    namespace: String,
    encoded: Bytes,
    /// Stream sequence of the last event, once its ack has said.
    sequence: Option<u64>,
}

impl Last {
    fn of(event: &PodEvent, encoded: Bytes) -> Last {
        Last {
            owner: event.owner.clone(),
            rv: event.resource_version.clone(),
            namespace: namespace(event).to_owned(),
            encoded,
            sequence: None,
        }
    }
}

/// How a pod was seen, which decides whether a pod the ingest does not know is new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sighting {
    /// A live watch event after this process's list: a pod not known here has no earlier
    /// event (had it existed before, the list would have shown it).
    Watch,
    /// A list or a history replay: a pod not known here may have been published by an
    /// earlier process whose checkpoint lagged.
    Listing,
}

/// The hasher of the ingest's per-pod maps: uids come from the apiserver, not from an
/// adversary who could flood one bucket, and SipHash was a visible share of each event.
pub type FastHash = foldhash::fast::RandomState;

/// A set of pod uids.
pub type UidSet = HashSet<String, FastHash>;

/// Deleted pods remembered (uid → deletion revision), so a late copy of the delete is skipped.
const TOMBSTONES: usize = 65_536;

/// The deletion revisions of the last `capacity` objects deleted, by uid: a late copy of a
/// deleted object's events is skipped, and memory stays bounded.
#[derive(Debug, Clone)]
pub struct Tombstones {
    revisions: HashMap<String, String, FastHash>,
    order: VecDeque<String>,
    capacity: usize,
}

impl Tombstones {
    /// Remembers at most `capacity` deletions, forgetting the oldest first.
    pub fn new(capacity: usize) -> Tombstones {
        Tombstones {
            revisions: HashMap::default(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// The revision `uid` was deleted at, if it is remembered.
    pub fn get(&self, uid: &str) -> Option<&String> {
        self.revisions.get(uid)
    }

    /// Remembers that `uid` was deleted at `rv`.
    pub fn bury(&mut self, uid: String, rv: String) {
        if self.revisions.insert(uid.clone(), rv).is_none() {
            self.order.push_back(uid);
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.revisions.remove(&oldest);
            }
        }
    }
}

/// The last published event of every pod the ingest knows.
#[derive(Debug, Clone)]
pub struct KnownPods {
    pods: HashMap<String, Last, FastHash>,
    tombstones: Tombstones,
}

impl Default for KnownPods {
    fn default() -> Self {
        KnownPods {
            pods: HashMap::default(),
            tombstones: Tombstones::new(TOMBSTONES),
        }
    }
}

impl KnownPods {
    /// Knows nothing.
    pub fn new() -> KnownPods {
        KnownPods::default()
    }

    /// Knows the given last events (from the checkpoint).
    pub fn from_events(events: impl IntoIterator<Item = PodEvent>) -> KnownPods {
        KnownPods {
            pods: events
                .into_iter()
                .map(|event| {
                    let last = Last::of(&event, Bytes::from(event.encode_to_vec()));
                    (uid(&event).to_owned(), last)
                })
                .collect(),
            ..KnownPods::default()
        }
    }

    /// How many pods it knows.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether it knows no pod.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The last event of a pod.
    pub fn get(&self, uid: &str) -> Option<PodEvent> {
        self.pods
            .get(uid)
            .and_then(|last| PodEvent::decode(last.encoded.as_ref()).ok())
    }

    /// What to publish for an observed event, remembering it.
    ///
    /// A pod that is not deleted is `ADDED` when the ingest did not know it and `MODIFIED`
    /// when it did, whichever way it was seen (watch, list, replay); nothing at all is
    /// published for a revision that is not newer than the last one published.
    pub fn observe(
        &mut self,
        subjects: &Subjects,
        mut event: PodEvent,
        sighting: Sighting,
    ) -> Vec<Outgoing> {
        let key = uid(&event).to_owned();
        let last = self.pods.get(&key);
        let buried = self.tombstones.get(&key);
        // A revision is one fact: published once, whoever sees it again; older ones are history.
        if last.is_some_and(|last| !is_newer(&event.resource_version, &last.rv))
            || buried.is_some_and(|gone| !is_newer(&event.resource_version, gone))
        {
            return Vec::new();
        }
        event.previous_sequence = match last {
            Some(last) => last.sequence,
            None if sighting == Sighting::Watch && buried.is_none() => Some(0),
            None => None,
        };
        if event.r#type() != EventType::Deleted {
            event.set_type(if last.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            });
        }
        let payload = Bytes::from(event.encode_to_vec());
        // The notice to the previous owner follows the event.
        let notice = match last {
            Some(last) if last.owner != event.owner => Some(Outgoing {
                subject: subjects.pod_events(&last.owner, &key),
                msg_id: msg_id(&event, Role::Left),
                role: Role::Left,
                event: event.clone(),
                payload: payload.clone(),
            }),
            _ => None,
        };
        let subject = subjects.pod_events(&event.owner, &key);
        let msg_id = msg_id(&event, Role::Event);
        if event.r#type() == EventType::Deleted {
            self.pods.remove(&key);
            self.tombstones.bury(key, event.resource_version.clone());
        } else {
            self.pods.insert(key, Last::of(&event, payload.clone()));
        }
        let mut out = Vec::with_capacity(2);
        out.push(Outgoing {
            subject,
            msg_id,
            role: Role::Event,
            event,
            payload,
        });
        out.extend(notice);
        out
    }

    /// Records where JetStream stored a published event (its ack's sequence), so the pod's
    /// next event can say so. Notices are not events; an ack overtaken by a newer event of
    /// the pod leaves that one's place unknown until its own ack.
    pub fn acked(&mut self, out: &Outgoing, sequence: u64) {
        if out.role != Role::Event {
            return;
        }
        if let Some(last) = self.pods.get_mut(uid(&out.event))
            && last.rv == out.event.resource_version
        {
            last.sequence = Some(sequence);
        }
    }

    /// After a (re-)list of `scope` (a namespace, or every namespace for `None`): a synthesized
    /// `DELETED` for every known pod in scope that was neither listed nor seen since (in
    /// `listed`), forgetting those pods.
    ///
    /// The synthesized event carries the pod's last facts and a resourceVersion one past its
    /// last, so the rules see it as newer than anything published for the pod.
    pub fn vanished<S: BuildHasher>(
        &mut self,
        subjects: &Subjects,
        scope: Option<&str>,
        listed: &HashSet<String, S>,
    ) -> Vec<Outgoing> {
        let mut gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(uid, last)| {
                !listed.contains(*uid) && scope.is_none_or(|ns| last.namespace == ns)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        gone.sort();
        let mut out = Vec::with_capacity(gone.len());
        for key in gone {
            let Some(last) = self.pods.remove(&key) else {
                continue;
            };
            let Ok(mut event) = PodEvent::decode(last.encoded.as_ref()) else {
                continue;
            };
            event.set_type(EventType::Deleted);
            event.synthesized = true;
            event.previous_sequence = last.sequence;
            event.resource_version = next_revision(&event.resource_version);
            self.tombstones
                .bury(key.clone(), event.resource_version.clone());
            out.push(Outgoing {
                subject: subjects.pod_events(&event.owner, &key),
                msg_id: msg_id(&event, Role::Event),
                role: Role::Event,
                payload: Bytes::from(event.encode_to_vec()),
                event,
            });
        }
        out
    }
}

/// A revision just after `rv`: `rv + 1` for etcd revisions, else `rv` with a suffix.
pub fn next_revision(rv: &str) -> String {
    match rv.parse::<u64>() {
        Ok(n) => (n + 1).to_string(),
        Err(_) => format!("{rv}+deleted"),
    }
}

//! `podstream ingest --spark`: the driver pods of Airflow-launched Spark jobs and the
//! SparkApplications that own them, published with the guarantees worker pods have (issue
//! 25): a deterministic `Nats-Msg-Id` per fact, one subject per object so its events keep
//! their order, the last event of each object in the checkpoint, and a synthesized `DELETED`
//! for an object that vanished while nobody watched.
//!
//! [`KnownSpark`] is the pure core (what to publish for an observed object); the watches are
//! [`watch_spark`]. Spark objects are few (one driver per running Spark task), so they are
//! read whole as JSON and kept without the care the worker pods' maps take over memory.
//! [`projection`] reduces an object to the `SparkEvent` the choice of driver reads.
//!
//! The seam into `podstream ingest` is [`SparkWatches`]: the service stages what each of its
//! items calls for and publishes with the worker pods' publisher and checkpoint.

pub mod projection;

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use podstream_bus::dead::DeadLetter;
use podstream_proto::msg_id;
use podstream_proto::revision::is_newer;
use podstream_proto::subject::{SparkKind, Subjects};
use podstream_proto::v1::spark_event::Object;
use podstream_proto::v1::{EventType, SparkEvent};
use prost::Message as _;

use crate::known::{Tombstones, next_revision};
use crate::listing::{ListAction, ListInput, ListState};
use crate::read_ahead::read_ahead;
use projection::{DRIVER_SELECTOR, project_spark};

/// The SparkApplication resource the Spark operator serves (`sparkoperator.k8s.io/v1beta2`).
pub fn spark_application_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("sparkoperator.k8s.io", "v1beta2", "SparkApplication");
    ApiResource::from_gvk_with_plural(&gvk, "sparkapplications")
}

/// One message for the Spark stream.
#[derive(Debug, Clone, PartialEq)]
pub struct SparkOutgoing {
    /// `podstream.spark.<drivers|applications>.<namespace>.<uid>`.
    pub subject: String,
    /// `Nats-Msg-Id`: `spark:<uid>:<resourceVersion>:<changed|deleted>`.
    pub msg_id: String,
    /// The event.
    pub event: SparkEvent,
    /// The event encoded once, for the bus and the checkpoint.
    pub payload: Bytes,
}

impl SparkOutgoing {
    /// The JetStream message: payload and `Nats-Msg-Id`.
    pub fn to_publish(&self) -> async_nats::jetstream::message::PublishMessage {
        async_nats::jetstream::message::PublishMessage::build()
            .payload(self.payload.clone())
            .message_id(&self.msg_id)
    }

    /// The object's uid.
    pub fn uid(&self) -> &str {
        identity(&self.event).2
    }
}

/// The kind, namespace and uid of an event's object ("" where absent, which projection never
/// produces).
pub fn identity(event: &SparkEvent) -> (SparkKind, &str, &str) {
    match &event.object {
        Some(Object::Application(application)) => {
            let object = application.application.as_ref();
            (
                SparkKind::Application,
                object.map_or("", |o| o.namespace.as_str()),
                object.map_or("", |o| o.uid.as_str()),
            )
        }
        Some(Object::Driver(driver)) => {
            let pod = driver.pod.as_ref();
            (
                SparkKind::Driver,
                pod.map_or("", |p| p.namespace.as_str()),
                pod.map_or("", |p| p.uid.as_str()),
            )
        }
        None => (SparkKind::Driver, "", ""),
    }
}

fn outgoing(subjects: &Subjects, event: SparkEvent) -> SparkOutgoing {
    let (kind, namespace, uid) = identity(&event);
    let deleted = event.r#type() == EventType::Deleted;
    SparkOutgoing {
        subject: subjects.spark(kind, namespace, uid),
        msg_id: msg_id::spark_event(uid, &event.resource_version, deleted),
        payload: Bytes::from(event.encode_to_vec()),
        event,
    }
}

/// Deleted objects remembered (uid → deletion revision), so a late copy of the delete is
/// skipped.
const TOMBSTONES: usize = 4_096;

/// The last published event of every Spark object the ingest knows.
#[derive(Debug)]
pub struct KnownSpark {
    objects: HashMap<String, SparkEvent>,
    tombstones: Tombstones,
}

impl Default for KnownSpark {
    fn default() -> Self {
        KnownSpark {
            objects: HashMap::new(),
            tombstones: Tombstones::new(TOMBSTONES),
        }
    }
}

impl KnownSpark {
    /// Knows the given last events (from the checkpoint).
    pub fn from_events(events: impl IntoIterator<Item = SparkEvent>) -> KnownSpark {
        KnownSpark {
            objects: events
                .into_iter()
                .map(|event| (identity(&event).2.to_owned(), event))
                .collect(),
            ..KnownSpark::default()
        }
    }

    /// How many objects it knows.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether it knows none.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// What to publish for an observed event, remembering it: nothing for a revision not
    /// newer than the last one published; otherwise the event, `ADDED` when the object was
    /// not known and `MODIFIED` when it was (whichever way it was seen).
    pub fn observe(&mut self, subjects: &Subjects, mut event: SparkEvent) -> Option<SparkOutgoing> {
        let uid = identity(&event).2.to_owned();
        let last = self.objects.get(&uid);
        if last.is_some_and(|last| !is_newer(&event.resource_version, &last.resource_version))
            || self
                .tombstones
                .get(&uid)
                .is_some_and(|gone| !is_newer(&event.resource_version, gone))
        {
            return None;
        }
        if event.r#type() != EventType::Deleted {
            event.set_type(if last.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            });
        }
        if event.r#type() == EventType::Deleted {
            self.objects.remove(&uid);
            self.tombstones.bury(uid, event.resource_version.clone());
        } else {
            self.objects.insert(uid, event.clone());
        }
        Some(outgoing(subjects, event))
    }

    /// After a (re-)list of `kind` in `scope` (a namespace, or all for `None`): a synthesized
    /// `DELETED` for every known object of that kind in scope that was neither listed nor
    /// seen since (in `listed`), with its last facts and a resourceVersion one past its last.
    pub fn vanished(
        &mut self,
        subjects: &Subjects,
        kind: SparkKind,
        scope: Option<&str>,
        listed: &HashSet<String, impl std::hash::BuildHasher>,
    ) -> Vec<SparkOutgoing> {
        let mut gone: Vec<String> = self
            .objects
            .iter()
            .filter(|(uid, event)| {
                let (of, namespace, _) = identity(event);
                of == kind && !listed.contains(*uid) && scope.is_none_or(|ns| namespace == ns)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        gone.sort();
        let mut out = Vec::with_capacity(gone.len());
        for uid in gone {
            let Some(mut event) = self.objects.remove(&uid) else {
                continue;
            };
            event.set_type(EventType::Deleted);
            event.synthesized = true;
            event.resource_version = next_revision(&event.resource_version);
            self.tombstones.bury(uid, event.resource_version.clone());
            out.push(outgoing(subjects, event));
        }
        out
    }
}

/// A Spark object as projected: its event, or the dead letter it becomes.
#[derive(Debug)]
pub enum SparkProjected {
    /// Its event.
    Event(Box<SparkEvent>),
    /// Why it cannot be used.
    Unusable(Box<DeadLetter>),
}

/// One Spark watch item, as the publishing loop takes it.
pub enum SparkWatched {
    /// What the scope's list state machine takes.
    List(ListInput<SparkProjected>),
    /// The watch failed; kube-runtime retries with backoff (a missing SparkApplication CRD
    /// fails this way until it is installed).
    Failed(Box<watcher::Error>),
}

/// The Spark watches of one ingest (`--spark`): their scopes, each one's list state, and
/// their items read ahead. Without `--spark` there are none and [`SparkWatches::next`] never
/// resolves. Spark objects are not part of readiness: a cluster without the
/// SparkApplication CRD fails that watch until it is installed, and worker pods must not
/// wait for it.
pub struct SparkWatches {
    scopes: Vec<SparkScope>,
    lists: Vec<ListState<SparkProjected>>,
    events: Option<tokio::sync::mpsc::Receiver<(usize, SparkWatched)>>,
}

impl SparkWatches {
    /// No Spark watches (no `--spark`).
    pub fn none() -> SparkWatches {
        SparkWatches {
            scopes: Vec::new(),
            lists: Vec::new(),
            events: None,
        }
    }

    /// Driver pods and SparkApplications watched in `namespaces` (all when empty), up to
    /// `depth` items read ahead.
    pub fn start(
        kube: &kube::Client,
        namespaces: &[String],
        subjects: Subjects,
        depth: usize,
    ) -> SparkWatches {
        let scopes = spark_scopes(namespaces);
        let events = read_ahead(watch_spark(kube, &scopes, subjects), depth);
        SparkWatches {
            lists: scopes.iter().map(|_| ListState::Watching).collect(),
            scopes,
            events: Some(events),
        }
    }

    /// The next watch item with its scope's index; never without watches.
    pub async fn next(&mut self) -> Option<(usize, SparkWatched)> {
        match &mut self.events {
            Some(events) => events.recv().await,
            None => std::future::pending().await,
        }
    }

    /// What the item of scope `index` calls for, with the scope (a failed watch is logged
    /// and calls for nothing: kube-runtime retries it).
    pub fn step(
        &mut self,
        index: usize,
        item: SparkWatched,
    ) -> Option<(&SparkScope, ListAction<SparkProjected>)> {
        let (scope, list) = (self.scopes.get(index)?, self.lists.get_mut(index)?);
        match item {
            SparkWatched::List(input) => Some((scope, list.on(input, None))),
            SparkWatched::Failed(error) => {
                tracing::warn!(kind = scope.kind.token(), namespace = ?scope.namespace, %error, "Spark watch failed; retrying with backoff");
                None
            }
        }
    }
}

/// One watched (kind, scope).
#[derive(Debug, Clone)]
pub struct SparkScope {
    /// Driver pods or SparkApplications.
    pub kind: SparkKind,
    /// The namespace, or all for `None`.
    pub namespace: Option<String>,
}

/// Every (kind, scope) to watch: driver pods and SparkApplications in each namespace.
pub fn spark_scopes(namespaces: &[String]) -> Vec<SparkScope> {
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    [SparkKind::Driver, SparkKind::Application]
        .into_iter()
        .flat_map(|kind| {
            scopes.iter().map(move |namespace| SparkScope {
                kind,
                namespace: namespace.clone(),
            })
        })
        .collect()
}

/// One watcher per scope, merged; items carry their scope's index.
pub fn watch_spark(
    kube: &kube::Client,
    scopes: &[SparkScope],
    subjects: Subjects,
) -> BoxStream<'static, (usize, SparkWatched)> {
    let streams: Vec<_> = scopes
        .iter()
        .enumerate()
        .map(|(index, scope)| {
            let (resource, config) = match scope.kind {
                SparkKind::Driver => (
                    ApiResource::erase::<Pod>(&()),
                    watcher::Config::default().labels(DRIVER_SELECTOR),
                ),
                SparkKind::Application => {
                    (spark_application_resource(), watcher::Config::default())
                }
            };
            let api: Api<DynamicObject> = match &scope.namespace {
                Some(ns) => Api::namespaced_with(kube.clone(), ns, &resource),
                None => Api::all_with(kube.clone(), &resource),
            };
            let kind = scope.kind;
            let subjects = subjects.clone();
            watcher(api, config)
                .default_backoff()
                .map(move |item| (index, watched(&subjects, kind, item)))
                .boxed()
        })
        .collect();
    futures::stream::select_all(streams).boxed()
}

fn watched(
    subjects: &Subjects,
    kind: SparkKind,
    item: Result<watcher::Event<DynamicObject>, watcher::Error>,
) -> SparkWatched {
    let input = match item {
        Ok(watcher::Event::Init) => ListInput::Started,
        Ok(watcher::Event::InitApply(object)) => ListInput::Listed {
            uid: object.metadata.uid.clone(),
            pod: project(subjects, kind, EventType::Added, &object),
        },
        Ok(watcher::Event::InitDone) => ListInput::Done,
        Ok(watcher::Event::Apply(object)) => {
            ListInput::Changed(project(subjects, kind, EventType::Modified, &object))
        }
        Ok(watcher::Event::Delete(object)) => {
            ListInput::Changed(project(subjects, kind, EventType::Deleted, &object))
        }
        Err(error) => return SparkWatched::Failed(Box::new(error)),
    };
    SparkWatched::List(input)
}

/// A watched object's event of `event_type`, or its dead letter.
fn project(
    subjects: &Subjects,
    kind: SparkKind,
    event_type: EventType,
    object: &DynamicObject,
) -> SparkProjected {
    let json = serde_json::to_value(object).unwrap_or_default();
    match project_spark(kind, event_type, &json) {
        Ok(event) => SparkProjected::Event(Box::new(event)),
        Err(unusable) => {
            let object = unusable.object;
            let rv = object_rv(&json);
            tracing::warn!(object = %object.name, namespace = %object.namespace, uid = %object.uid, reason = %unusable.reason, "unusable Spark object; dead-lettered");
            SparkProjected::Unusable(Box::new(DeadLetter::of_object(
                subjects,
                msg_id::dead_spark_object(&object.uid, rv),
                format!(
                    "{} {}/{} uid {} resourceVersion {rv}",
                    kind.token(),
                    object.namespace,
                    object.name,
                    object.uid
                ),
                unusable.reason,
                Bytes::from(crate::dead_pod::kept(&json.to_string())),
            )))
        }
    }
}

fn object_rv(json: &serde_json::Value) -> &str {
    json["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use podstream_proto::subject::{SparkKind, Subjects};
    use podstream_proto::v1::spark_event::Object;
    use podstream_proto::v1::{EventType, PodRef, SparkApplication, SparkDriver, SparkEvent};

    use super::KnownSpark;

    fn driver(uid: &str, namespace: &str, kind: EventType, rv: &str) -> SparkEvent {
        SparkEvent {
            r#type: kind as i32,
            resource_version: rv.into(),
            synthesized: false,
            object: Some(Object::Driver(SparkDriver {
                pod: Some(PodRef {
                    namespace: namespace.into(),
                    name: format!("{uid}-driver"),
                    uid: uid.into(),
                }),
                ..SparkDriver::default()
            })),
        }
    }

    fn application(uid: &str, rv: &str) -> SparkEvent {
        SparkEvent {
            r#type: EventType::Modified as i32,
            resource_version: rv.into(),
            synthesized: false,
            object: Some(Object::Application(SparkApplication {
                application: Some(PodRef {
                    namespace: "airflow".into(),
                    name: "app".into(),
                    uid: uid.into(),
                }),
                ..SparkApplication::default()
            })),
        }
    }

    /// (subject, msg id, type) of what `observe` publishes.
    fn published(known: &mut KnownSpark, event: SparkEvent) -> Option<(String, String, EventType)> {
        known
            .observe(&Subjects::default(), event)
            .map(|out| (out.subject, out.msg_id, out.event.r#type()))
    }

    #[test]
    fn each_revision_of_an_object_is_published_once_on_its_own_subject() {
        let mut known = KnownSpark::default();
        let table = [
            (
                "first sight, whatever the watch called it",
                driver("d1", "airflow", EventType::Modified, "5"),
                Some((
                    "podstream.spark.drivers.airflow.d1",
                    "spark:d1:5:changed",
                    EventType::Added,
                )),
            ),
            (
                "the same revision again (a re-list)",
                driver("d1", "airflow", EventType::Added, "5"),
                None,
            ),
            (
                "an older revision (a late replay)",
                driver("d1", "airflow", EventType::Modified, "4"),
                None,
            ),
            (
                "a change",
                driver("d1", "airflow", EventType::Added, "9"),
                Some((
                    "podstream.spark.drivers.airflow.d1",
                    "spark:d1:9:changed",
                    EventType::Modified,
                )),
            ),
            (
                "an application",
                application("a1", "10"),
                Some((
                    "podstream.spark.applications.airflow.a1",
                    "spark:a1:10:changed",
                    EventType::Added,
                )),
            ),
            (
                "the delete",
                driver("d1", "airflow", EventType::Deleted, "11"),
                Some((
                    "podstream.spark.drivers.airflow.d1",
                    "spark:d1:11:deleted",
                    EventType::Deleted,
                )),
            ),
            (
                "a late copy of the delete",
                driver("d1", "airflow", EventType::Deleted, "11"),
                None,
            ),
        ];
        for (story, event, expected) in table {
            let expected =
                expected.map(|(subject, id, kind)| (subject.to_owned(), id.to_owned(), kind));
            assert_eq!(published(&mut known, event), expected, "{story}");
        }
        assert_eq!(known.len(), 1, "only the application is left");
    }

    #[test]
    fn objects_of_the_kind_and_scope_that_were_not_listed_vanished() {
        let subjects = Subjects::default();
        let mut known = KnownSpark::from_events([
            driver("kept", "airflow", EventType::Added, "5"),
            driver("gone", "airflow", EventType::Added, "6"),
            driver("elsewhere", "other", EventType::Added, "7"),
            application("app", "8"),
        ]);
        let listed: HashSet<String> = ["kept".to_owned()].into();
        let out = known.vanished(&subjects, SparkKind::Driver, Some("airflow"), &listed);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].uid(), "gone");
        assert_eq!(out[0].event.r#type(), EventType::Deleted);
        assert!(out[0].event.synthesized);
        assert_eq!(out[0].event.resource_version, "7");
        assert_eq!(out[0].msg_id, "spark:gone:7:deleted");
        assert_eq!(known.len(), 3);
        // Its late copies change nothing.
        assert!(
            known
                .observe(&subjects, driver("gone", "airflow", EventType::Added, "6"))
                .is_none()
        );
        let all = known.vanished(
            &subjects,
            SparkKind::Application,
            None,
            &HashSet::<String>::new(),
        );
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].subject, "podstream.spark.applications.airflow.app");
    }
}

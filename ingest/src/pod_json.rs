//! A pod watch event projected straight from its JSON text, reading only the
//! fields the projection needs and skipping the rest unparsed.
//!
//! `podstream decide` reads most of its input this way: a worker pod is about a
//! kilobyte of JSON, of which the rules read a tenth, and building k8s-openapi's
//! whole `Pod` (every spec and status field, owned) costs more than deciding.
//! Whatever this reader does not take (bare pods, lists, bookmarks, anything
//! malformed in a field it reads) goes to [`crate::watch_json`], which says
//! precisely what is wrong.
//!
//! Fields it reads are read as k8s-openapi reads them (a `null` or absent
//! required field is its default), so both paths project a valid pod alike.
//! Fields it skips are not checked: a pod malformed only where the rules never
//! look is still decided.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use podstream_proto::v1::{EventType, PodEvent, PodRef};
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::projection::{
    DONE_LABEL, KeyAnnotations, Labels, OWNER_LABEL, PodFacts, ProjectionError, REVOKED_LABEL,
    StatusFacts, project_facts, unix_ms,
};

/// A projected pod watch event, or why its pod cannot be projected (with the
/// pod's reference, for the report).
pub type Projected = Result<PodEvent, (ProjectionError, PodRef)>;

/// Projects one `{"type": ..., "object": <Pod>}` watch event of type `ADDED`,
/// `MODIFIED` or `DELETED`. `None` when `text` is anything else or does not
/// read this way: the caller takes the [`crate::watch_json`] path.
pub fn project_watch_event(text: &str) -> Option<Projected> {
    let Object(event) = serde_json::from_str::<Object<WatchEventJson>>(text).ok()?;
    let event_type = match event.event_type.as_ref() {
        "ADDED" => EventType::Added,
        "MODIFIED" => EventType::Modified,
        "DELETED" => EventType::Deleted,
        _ => return None,
    };
    project_read(event_type, &event.object)
}

/// Projects one pod object, given as its JSON text, as an event of `event_type`. `None` when
/// `text` does not read this way (not an object, another kind, a field the rules read
/// malformed): the caller takes k8s-openapi's `Pod`, which says precisely what is wrong.
pub fn project_pod(text: &str, event_type: EventType) -> Option<Projected> {
    let Object(pod) = serde_json::from_str::<Object<PodJson>>(text).ok()?;
    project_read(event_type, &pod)
}

fn project_read(event_type: EventType, pod: &PodJson) -> Option<Projected> {
    // k8s-openapi refuses another kind or version; leave those to the generic path.
    if pod.kind.as_deref().is_some_and(|k| k != "Pod")
        || pod.api_version.as_deref().is_some_and(|v| v != "v1")
    {
        return None;
    }
    let facts = pod.facts();
    Some(project_facts(event_type, &facts).map_err(|err| (err, facts.pod_ref())))
}

/// A JSON object read as `T`. serde's derive would also take an array as the
/// struct's fields in order; k8s-openapi (and a map) refuse one, and so must this.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(ObjectVisitor(PhantomData))
            .map(Object)
    }
}

impl<T> std::ops::Deref for Object<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[derive(Deserialize)]
struct WatchEventJson<'a> {
    #[serde(rename = "type", borrow)]
    event_type: Text<'a>,
    #[serde(borrow)]
    object: Object<PodJson<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodJson<'a> {
    #[serde(borrow, default)]
    api_version: Option<Text<'a>>,
    #[serde(borrow, default)]
    kind: Option<Text<'a>>,
    #[serde(borrow, default)]
    metadata: Option<Object<MetaJson<'a>>>,
    #[serde(borrow, default)]
    spec: Option<Object<SpecJson<'a>>>,
    #[serde(borrow, default)]
    status: Option<Object<StatusJson<'a>>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaJson<'a> {
    #[serde(borrow, default)]
    uid: Option<Text<'a>>,
    #[serde(borrow, default)]
    namespace: Option<Text<'a>>,
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    resource_version: Option<Text<'a>>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(borrow, default)]
    labels: Option<LabelsJson<'a>>,
    #[serde(borrow, default)]
    annotations: Option<AnnotationsJson<'a>>,
}

/// The labels the projection reads. Every value of the map must be a string,
/// as k8s-openapi requires; the others are checked and dropped.
#[derive(Default)]
struct LabelsJson<'a> {
    owner: Option<Text<'a>>,
    done: Option<Text<'a>>,
    revoked: Option<Text<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for LabelsJson<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut labels = LabelsJson::default();
        read_string_map(deserializer, |key, value| {
            let slot = match key {
                OWNER_LABEL => &mut labels.owner,
                DONE_LABEL => &mut labels.done,
                REVOKED_LABEL => &mut labels.revoked,
                _ => return,
            };
            *slot = Some(value);
        })?;
        Ok(labels)
    }
}

/// The annotations that name the task instance; as for labels, every value
/// must be a string.
#[derive(Default)]
struct AnnotationsJson<'a> {
    dag_id: Option<Text<'a>>,
    task_id: Option<Text<'a>>,
    run_id: Option<Text<'a>>,
    try_number: Option<Text<'a>>,
    map_index: Option<Text<'a>>,
    logical_date: Option<Text<'a>>,
    execution_date: Option<Text<'a>>,
    task_instance_id: Option<Text<'a>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for AnnotationsJson<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut a = AnnotationsJson::default();
        read_string_map(deserializer, |key, value| {
            let slot = match key {
                "dag_id" => &mut a.dag_id,
                "task_id" => &mut a.task_id,
                "run_id" => &mut a.run_id,
                "try_number" => &mut a.try_number,
                "map_index" => &mut a.map_index,
                "logical_date" => &mut a.logical_date,
                "execution_date" => &mut a.execution_date,
                "task_instance_id" => &mut a.task_instance_id,
                _ => return,
            };
            *slot = Some(value);
        })?;
        Ok(a)
    }
}

/// Reads a JSON object of strings, handing each entry to `keep` (a later
/// duplicate key wins, as in a map).
fn read_string_map<'de: 'a, 'a, D: Deserializer<'de>>(
    deserializer: D,
    keep: impl FnMut(&str, Text<'a>),
) -> Result<(), D::Error> {
    struct StringMap<'a, F>(F, PhantomData<&'a ()>);
    impl<'de: 'a, 'a, F: FnMut(&str, Text<'a>)> Visitor<'de> for StringMap<'a, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<Text<'de>>()? {
                let value = map.next_value::<Text<'a>>()?;
                (self.0)(&key, value);
            }
            Ok(())
        }
    }
    deserializer.deserialize_map(StringMap(keep, PhantomData))
}

/// A JSON string, borrowed from the text unless it holds escapes. (serde's own
/// `Cow<str>` always copies.)
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, value: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(value)))
            }
            fn visit_str<E>(self, value: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(value.to_owned())))
            }
            fn visit_string<E>(self, value: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(value)))
            }
        }
        deserializer.deserialize_str(TextVisitor(PhantomData))
    }
}

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

#[derive(Deserialize)]
struct SpecJson<'a> {
    #[serde(borrow, default)]
    containers: Option<Vec<Object<NameJson<'a>>>>,
}

#[derive(Deserialize)]
struct NameJson<'a> {
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusJson<'a> {
    #[serde(borrow, default)]
    phase: Option<Text<'a>>,
    #[serde(borrow, default)]
    reason: Option<Text<'a>>,
    #[serde(borrow, default)]
    init_container_statuses: Option<Vec<Object<ContainerStatusJson<'a>>>>,
    #[serde(borrow, default)]
    container_statuses: Option<Vec<Object<ContainerStatusJson<'a>>>>,
}

#[derive(Deserialize)]
struct ContainerStatusJson<'a> {
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    state: Option<Object<StateJson<'a>>>,
}

#[derive(Deserialize)]
struct StateJson<'a> {
    #[serde(borrow, default)]
    waiting: Option<Object<WaitingJson<'a>>>,
    #[serde(borrow, default)]
    terminated: Option<Object<TerminatedJson<'a>>>,
}

#[derive(Deserialize)]
struct WaitingJson<'a> {
    #[serde(borrow, default)]
    reason: Option<Text<'a>>,
    #[serde(borrow, default)]
    message: Option<Text<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TerminatedJson<'a> {
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(borrow, default)]
    reason: Option<Text<'a>>,
}

impl PodJson<'_> {
    fn facts(&self) -> PodFacts<'_> {
        let meta = self.metadata.as_ref();
        let labels = meta.and_then(|m| m.labels.as_ref());
        let status = self.status.as_ref();
        PodFacts {
            uid: meta.and_then(|m| text(&m.uid)),
            namespace: meta.and_then(|m| text(&m.namespace)),
            name: meta.and_then(|m| text(&m.name)),
            resource_version: meta.and_then(|m| text(&m.resource_version)),
            creation_unix_ms: meta
                .and_then(|m| m.creation_timestamp.as_ref())
                .map(unix_ms),
            deletion_unix_ms: meta
                .and_then(|m| m.deletion_timestamp.as_ref())
                .map(unix_ms),
            labels: Labels {
                owner: labels.and_then(|l| text(&l.owner)),
                done: labels.and_then(|l| text(&l.done)),
                revoked: labels.and_then(|l| text(&l.revoked)),
            },
            annotations: meta
                .and_then(|m| m.annotations.as_ref())
                .map(|a| KeyAnnotations {
                    dag_id: text(&a.dag_id),
                    task_id: text(&a.task_id),
                    run_id: text(&a.run_id),
                    try_number: text(&a.try_number),
                    map_index: text(&a.map_index),
                    logical_date: text(&a.logical_date),
                    execution_date: text(&a.execution_date),
                    task_instance_id: text(&a.task_instance_id),
                }),
            phase: status.and_then(|s| text(&s.phase)),
            status_reason: status.and_then(|s| text(&s.reason)),
            first_container: self
                .spec
                .as_ref()
                .and_then(|s| s.containers.as_ref()?.first())
                .map(|c| c.name.as_deref().unwrap_or_default()),
            init_statuses: statuses(status.and_then(|s| s.init_container_statuses.as_deref())),
            app_statuses: statuses(status.and_then(|s| s.container_statuses.as_deref())),
        }
    }
}

impl ContainerStatusJson<'_> {
    fn facts(&self) -> StatusFacts<'_> {
        let state = self.state.as_ref();
        StatusFacts {
            name: self.name.as_deref().unwrap_or_default(),
            waiting: state
                .and_then(|s| s.waiting.as_ref())
                .map(|w| (w.reason.as_deref(), w.message.as_deref())),
            terminated: state
                .and_then(|s| s.terminated.as_ref())
                .map(|t| (t.exit_code.unwrap_or_default(), t.reason.as_deref())),
        }
    }
}

fn text<'a>(value: &'a Option<Text<'_>>) -> Option<&'a str> {
    value.as_deref()
}

fn statuses<'a>(list: Option<&'a [Object<ContainerStatusJson<'_>>]>) -> Vec<StatusFacts<'a>> {
    list.map(|l| l.iter().map(|s| s.facts()).collect())
        .unwrap_or_default()
}

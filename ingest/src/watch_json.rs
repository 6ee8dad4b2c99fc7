//! Kubernetes JSON as `kubectl` prints it, read into pods with their event
//! type: watch events (`{"type": ..., "object": ...}`, as
//! `kubectl get -w --output-watch-events -o json` prints them), bare `Pod`s
//! and `PodList`/`List`s (read as `ADDED`).

use k8s_openapi::api::core::v1::Pod;
use podstream_proto::v1::{EventType, PodRef};
use serde::Deserialize;
use serde_json::Value;

/// A watch event of a pod, in the shape nearly every input value has.
#[derive(Deserialize)]
struct PodWatchEvent {
    #[serde(rename = "type")]
    event_type: String,
    object: Pod,
}

/// Reads every item of one JSON text.
///
/// Watch events of pods, nearly all of any stream, are deserialized straight
/// into `Pod`; anything else takes the [`read_value`] path, which builds a
/// generic value first so that it can say precisely what is wrong.
pub fn read_json(text: &str) -> Vec<WatchItem> {
    if let Ok(event) = serde_json::from_str::<PodWatchEvent>(text) {
        let event_type = match event.event_type.as_str() {
            "ADDED" => Some(EventType::Added),
            "MODIFIED" => Some(EventType::Modified),
            "DELETED" => Some(EventType::Deleted),
            _ => None,
        };
        if let Some(event_type) = event_type {
            return vec![WatchItem::Pod {
                event_type,
                pod: Box::new(event.object),
            }];
        }
    }
    match serde_json::from_str::<Value>(text) {
        Ok(value) => read_value(value),
        Err(err) => vec![invalid(format!("not valid JSON: {err}"), None)],
    }
}

/// One thing found in a JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchItem {
    /// A pod with the type of the event that carried it.
    Pod {
        /// `ADDED`, `MODIFIED` or `DELETED`.
        event_type: EventType,
        /// The pod as it is now.
        pod: Box<Pod>,
    },
    /// A watch bookmark: progress only, no pod change.
    Bookmark {
        /// The resourceVersion the watch has reached.
        resource_version: String,
    },
    /// A watch `ERROR` event (a `Status`, e.g. 410 Gone).
    WatchError {
        /// The status message.
        message: String,
    },
    /// A value that is not a pod, a pod list or a watch event.
    Invalid {
        /// What was wrong, in words.
        error: String,
        /// The object's reference, as far as it could be read.
        pod: Option<PodRef>,
    },
}

/// Reads every item of one JSON value.
pub fn read_value(value: Value) -> Vec<WatchItem> {
    let Value::Object(mut map) = value else {
        return vec![invalid(
            format!("expected a JSON object, found {}", type_name(&value)),
            None,
        )];
    };
    if let Some(event_type) = map.get("type").and_then(Value::as_str).map(str::to_owned) {
        let object = map.remove("object").unwrap_or(Value::Null);
        return vec![read_event(&event_type, object)];
    }
    match map.get("kind").and_then(Value::as_str) {
        Some("Pod") => vec![read_pod(EventType::Added, Value::Object(map))],
        Some("PodList" | "List") => match map.remove("items") {
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item.get("kind").and_then(Value::as_str) {
                    // kubectl's `List` can mix kinds; PodList items carry no kind.
                    None | Some("Pod") => read_pod(EventType::Added, item),
                    Some(other) => invalid(
                        format!("list item of kind {other:?} is not a Pod"),
                        object_ref(&item),
                    ),
                })
                .collect(),
            _ => vec![invalid("list has no `items` array", None)],
        },
        Some(other) => {
            let pod = object_ref(&Value::Object(map.clone()));
            vec![invalid(
                format!("object of kind {other:?} is not a Pod"),
                pod,
            )]
        }
        None => vec![invalid(
            "object is neither a watch event (`type`) nor a Kubernetes object (`kind`)",
            None,
        )],
    }
}

fn read_event(event_type: &str, object: Value) -> WatchItem {
    let event_type = match event_type {
        "ADDED" => EventType::Added,
        "MODIFIED" => EventType::Modified,
        "DELETED" => EventType::Deleted,
        "BOOKMARK" => {
            let resource_version = object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            return WatchItem::Bookmark { resource_version };
        }
        "ERROR" => {
            let message = object
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("watch error without message");
            return WatchItem::WatchError {
                message: message.to_owned(),
            };
        }
        other => {
            return invalid(
                format!("unknown watch event type {other:?}"),
                object_ref(&object),
            );
        }
    };
    match object.get("kind").and_then(Value::as_str) {
        None | Some("Pod") => read_pod(event_type, object),
        Some(other) => invalid(
            format!("watch event object of kind {other:?} is not a Pod"),
            object_ref(&object),
        ),
    }
}

fn read_pod(event_type: EventType, object: Value) -> WatchItem {
    if !object.is_object() {
        return invalid(
            format!("pod is {}, not an object", type_name(&object)),
            None,
        );
    }
    let pod_ref = object_ref(&object);
    match serde_json::from_value::<Pod>(object) {
        Ok(pod) => WatchItem::Pod {
            event_type,
            pod: Box::new(pod),
        },
        Err(err) => invalid(format!("not a valid Pod: {err}"), pod_ref),
    }
}

/// The reference of a JSON object, read leniently, for error reports.
fn object_ref(object: &Value) -> Option<PodRef> {
    let meta = object.get("metadata")?;
    let field = |name: &str| {
        meta.get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let pod = PodRef {
        namespace: field("namespace"),
        name: field("name"),
        uid: field("uid"),
    };
    (pod != PodRef::default()).then_some(pod)
}

fn invalid(error: impl Into<String>, pod: Option<PodRef>) -> WatchItem {
    WatchItem::Invalid {
        error: error.into(),
        pod,
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

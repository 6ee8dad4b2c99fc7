//! A worker pod as the ingest watches it: projected while it is read, from its JSON text,
//! by the lean reader `decide` uses ([`crate::pod_json`]), and kept whole only when it cannot
//! be projected (for its dead letter).
//!
//! Building k8s-openapi's `Pod` (every label, annotation, container, volume and probe, owned)
//! was the largest cost of an initial list in the ingest's profile; the rules read a tenth of
//! a pod. Reading each pod as text first has a second gain: a pod malformed where k8s-openapi
//! would refuse it no longer fails the whole list it came in (which kube-runtime's watcher
//! would retry forever); it becomes that one pod's dead letter, and the list goes on.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use podstream_proto::PodEvent;
use podstream_proto::v1::EventType;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::pod_json;
use crate::projection::project;

/// A pod from the watch: its identity, and its event or why it has none.
#[derive(Debug, Clone)]
pub struct WatchedPod {
    /// Name, namespace, uid and resourceVersion only: what kube-runtime and the ingest read.
    pub metadata: ObjectMeta,
    read: Read,
}

#[derive(Debug, Clone)]
enum Read {
    Projected(Box<PodEvent>),
    Unusable { reason: String, raw: Box<RawValue> },
}

/// A pod that cannot be projected: why, its identity as far as it reads, and the pod as
/// received.
#[derive(Debug)]
pub struct Unusable {
    /// Why, for the `Podstream-Reason` header.
    pub reason: String,
    /// Name, namespace, uid and resourceVersion, where they read as text.
    pub metadata: ObjectMeta,
    /// The pod's JSON, exactly as received.
    pub raw: Box<RawValue>,
}

impl WatchedPod {
    /// The pod's event, as an event of `kind`, or why it has none.
    pub fn into_event(self, kind: EventType) -> Result<PodEvent, Box<Unusable>> {
        match self.read {
            Read::Projected(mut event) => {
                event.set_type(kind);
                Ok(*event)
            }
            Read::Unusable { reason, raw } => Err(Box::new(Unusable {
                reason,
                metadata: self.metadata,
                raw,
            })),
        }
    }

    fn read(raw: Box<RawValue>) -> WatchedPod {
        // The type is set when the event is taken; `Added` is a placeholder.
        let placeholder = EventType::Added;
        let projected = match pod_json::project_pod(raw.get(), placeholder) {
            Some(projected) => projected.map_err(|(error, _)| error.to_string()),
            // The lean reader declined: k8s-openapi says what is wrong, or projects it.
            None => match serde_json::from_str::<Pod>(raw.get()) {
                Ok(pod) => project(placeholder, &pod).map_err(|e| e.to_string()),
                Err(error) => Err(format!("not a readable pod: {error}")),
            },
        };
        match projected {
            Ok(event) => WatchedPod {
                metadata: ObjectMeta {
                    name: event.pod.as_ref().map(|p| p.name.clone()),
                    namespace: event.pod.as_ref().map(|p| p.namespace.clone()),
                    uid: event.pod.as_ref().map(|p| p.uid.clone()),
                    resource_version: Some(event.resource_version.clone()),
                    ..ObjectMeta::default()
                },
                read: Read::Projected(Box::new(event)),
            },
            Err(reason) => WatchedPod {
                metadata: identity(raw.get()),
                read: Read::Unusable { reason, raw },
            },
        }
    }
}

/// Name, namespace, uid and resourceVersion of a pod's JSON, as far as they read as text.
fn identity(text: &str) -> ObjectMeta {
    #[derive(Deserialize, Default)]
    struct Identity<'a> {
        #[serde(default, borrow)]
        metadata: Option<Meta<'a>>,
    }
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta<'a> {
        #[serde(default, borrow)]
        name: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        namespace: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        uid: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        resource_version: Option<Cow<'a, str>>,
    }
    let meta = serde_json::from_str::<Identity>(text)
        .ok()
        .and_then(|i| i.metadata)
        .unwrap_or_default();
    ObjectMeta {
        name: meta.name.map(Cow::into_owned),
        namespace: meta.namespace.map(Cow::into_owned),
        uid: meta.uid.map(Cow::into_owned),
        resource_version: meta.resource_version.map(Cow::into_owned),
        ..ObjectMeta::default()
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(WatchedPod::read)
    }
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

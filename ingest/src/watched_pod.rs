//! A worker pod as the ingest watches it: metadata and status parsed as k8s-openapi parses
//! them, the spec kept as its JSON text with only the first container's name read.
//!
//! The rules never read the spec beyond that name, and building k8s-openapi's `PodSpec`
//! (every container, volume, probe and toleration, owned) was the single largest cost of an
//! initial list in the ingest's profile. Keeping the text, not dropping it, means a dead
//! letter still carries the whole pod.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::projection::PodFacts;

/// A pod from the watch: what the projection reads, and the spec as text.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct WatchedPod {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`, as received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<WatchedSpec>,
    /// `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
}

/// A pod's spec: its JSON text and the name of its first container (Airflow's `base`).
#[derive(Debug, Clone)]
pub struct WatchedSpec {
    raw: Box<RawValue>,
    first_container: Option<String>,
}

impl WatchedSpec {
    /// The name of the spec's first container, if it has one.
    pub fn first_container(&self) -> Option<&str> {
        self.first_container.as_deref()
    }

    /// The spec as received.
    pub fn json(&self) -> &str {
        self.raw.get()
    }
}

impl Default for WatchedSpec {
    fn default() -> Self {
        WatchedSpec {
            raw: RawValue::NULL.to_owned(),
            first_container: None,
        }
    }
}

impl<'de> Deserialize<'de> for WatchedSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Only the containers' names; everything else is skipped unparsed.
        #[derive(Deserialize)]
        struct Names<'a> {
            #[serde(default, borrow)]
            containers: Option<Vec<Named<'a>>>,
        }
        #[derive(Deserialize)]
        struct Named<'a> {
            #[serde(default, borrow)]
            name: Option<Cow<'a, str>>,
        }
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        // A spec whose containers cannot be read has no first container, as for
        // k8s-openapi a `null` or absent required field is its default; the pod still projects.
        let first_container = serde_json::from_str::<Names>(raw.get())
            .ok()
            .and_then(|names| names.containers)
            .and_then(|containers| containers.into_iter().next())
            .map(|first| first.name.map(Cow::into_owned).unwrap_or_default());
        Ok(WatchedSpec {
            raw,
            first_container,
        })
    }
}

impl Serialize for WatchedSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

impl WatchedPod {
    /// The facts the projection reads.
    pub fn facts(&self) -> PodFacts<'_> {
        PodFacts::from_parts(
            &self.metadata,
            self.spec.as_ref().and_then(WatchedSpec::first_container),
            self.status.as_ref(),
        )
    }

    /// The pod as JSON, `apiVersion` and `kind` included, as a dead letter carries it.
    pub fn to_json(&self) -> serde_json::Result<Vec<u8>> {
        #[derive(Serialize)]
        struct Typed<'a> {
            #[serde(rename = "apiVersion")]
            api_version: &'static str,
            kind: &'static str,
            #[serde(flatten)]
            pod: &'a WatchedPod,
        }
        serde_json::to_vec(&Typed {
            api_version: "v1",
            kind: "Pod",
            pod: self,
        })
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

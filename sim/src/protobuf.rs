//! Request bodies in Kubernetes' protobuf encoding, as kubectl's typed clients send them
//! (`kubectl create namespace`): the `k8s\0` magic, then a `runtime.Unknown` envelope whose
//! `raw` holds the object. The simulator decodes the kinds such clients create and answers
//! 415, as kube-apiserver does for a media type it cannot read, for the rest.

use prost::Message;
use serde_json::{Map, Value, json};

use crate::status::{ApiError, Reason};

/// The content type of a protobuf body.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

/// `k8s.io.apimachinery.pkg.runtime.Unknown`.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
}

/// `k8s.io.apimachinery.pkg.runtime.TypeMeta`.
#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

/// `k8s.io.api.core.v1.Namespace`, the fields a create may set.
#[derive(Clone, PartialEq, Message)]
struct Namespace {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<NamespaceSpec>,
}

/// `k8s.io.api.core.v1.NamespaceSpec`.
#[derive(Clone, PartialEq, Message)]
struct NamespaceSpec {
    #[prost(string, repeated, tag = "1")]
    finalizers: Vec<String>,
}

/// `k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta`, the fields a client may set on create.
#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: std::collections::BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: std::collections::BTreeMap<String, String>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

/// Decodes a protobuf request body into the JSON object the rest of the simulator handles.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request("the protobuf body does not start with the k8s\\0 magic")
    })?;
    let unknown = Unknown::decode(envelope)
        .map_err(|e| ApiError::bad_request(format!("decoding the protobuf envelope: {e}")))?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => {
            let namespace = Namespace::decode(raw.as_slice()).map_err(|e| {
                ApiError::bad_request(format!("decoding a protobuf v1 Namespace: {e}"))
            })?;
            let mut value = json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": metadata(namespace.metadata.unwrap_or_default()),
            });
            if let Some(spec) = namespace.spec.filter(|s| !s.finalizers.is_empty()) {
                value["spec"] = json!({ "finalizers": spec.finalizers });
            }
            Ok(value)
        }
        _ => Err(ApiError::new(
            Reason::UnsupportedMediaType,
            format!(
                "the body of the request was in an unknown format - the podstream simulator reads {CONTENT_TYPE} for v1 Namespace only (got {api_version} {kind}); accepted media types include: application/json"
            ),
        )),
    }
}

fn metadata(meta: ObjectMeta) -> Value {
    let mut out = Map::new();
    let mut put = |key: &str, value: Option<String>| {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            out.insert(key.to_owned(), json!(value));
        }
    };
    put("name", meta.name);
    put("generateName", meta.generate_name);
    put("namespace", meta.namespace);
    if !meta.labels.is_empty() {
        out.insert("labels".into(), json!(meta.labels));
    }
    if !meta.annotations.is_empty() {
        out.insert("annotations".into(), json!(meta.annotations));
    }
    if !meta.finalizers.is_empty() {
        out.insert("finalizers".into(), json!(meta.finalizers));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
        };
        let mut body = MAGIC.to_vec();
        body.extend(unknown.encode_to_vec());
        body
    }

    #[test]
    fn a_namespace_decodes_to_its_json() {
        let namespace = Namespace {
            metadata: Some(ObjectMeta {
                name: Some("team-a".into()),
                labels: [("team".to_owned(), "a".to_owned())].into(),
                ..ObjectMeta::default()
            }),
            spec: None,
        };
        let body = envelope("v1", "Namespace", namespace.encode_to_vec());
        let value = decode(&body).ok();
        assert_eq!(
            value,
            Some(json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": { "name": "team-a", "labels": { "team": "a" } },
            }))
        );
    }

    #[test]
    fn other_kinds_are_unsupported_media() {
        let body = envelope("v1", "ConfigMap", Vec::new());
        assert_eq!(decode(&body).map_err(|e| e.code()), Err(415));
    }

    #[test]
    fn garbage_is_a_bad_request() {
        assert_eq!(decode(b"{}").map_err(|e| e.code()), Err(400));
        assert_eq!(decode(b"k8s\0\xff\xff\xff").map_err(|e| e.code()), Err(400));
    }
}

//! Stored objects: what the store keeps of each object, and the defaulting and validation
//! kube-apiserver applies on create and update.

use std::collections::BTreeMap;

use bytes::Bytes;
use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::names::{is_dns_label, is_dns_subdomain, validate_label_key, validate_label_value};
use crate::resource::Resource;
use crate::status::{ApiError, Reason};

/// Where an object lives: resource, namespace ("" when cluster-scoped), name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The resource type.
    pub resource: Resource,
    /// The namespace, or "" for cluster-scoped resources.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl Key {
    /// A key, dropping the namespace for cluster-scoped resources.
    pub fn new(resource: Resource, namespace: &str, name: &str) -> Key {
        let namespace = if resource.namespaced() { namespace } else { "" };
        Key {
            resource,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// One version of an object as stored: its serialized JSON plus what selectors need.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Where it lives.
    pub key: Key,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`, the revision that wrote this version.
    pub resource_version: u64,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// Values of the resource's selectable fields, in `Resource::selectable_fields` order.
    pub fields: Vec<String>,
    /// `metadata.deletionTimestamp`, once a graceful delete began.
    pub deletion: Option<Timestamp>,
    /// Whether `metadata.finalizers` is non-empty.
    pub has_finalizers: bool,
    /// The object as compact JSON, `kind` and `apiVersion` included, shared by every reader.
    pub json: Bytes,
}

impl Stored {
    /// Builds the stored form of an object that has its final metadata.
    pub fn from_value(resource: Resource, value: &Value) -> Result<Stored, ApiError> {
        let meta = value.get("metadata").unwrap_or(&Value::Null);
        let text = |field: &str| meta.get(field).and_then(Value::as_str).unwrap_or_default();
        let key = Key::new(resource, text("namespace"), text("name"));
        let labels = string_map(meta.get("labels"));
        let fields = resource
            .selectable_fields()
            .iter()
            .map(|path| field_value(value, path))
            .collect();
        let deletion = meta
            .get("deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok());
        let has_finalizers = meta
            .get("finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        let resource_version = text("resourceVersion").parse().unwrap_or_default();
        let json = serde_json::to_vec(value)
            .map_err(|e| ApiError::new(Reason::InternalError, format!("serializing: {e}")))?;
        Ok(Stored {
            uid: text("uid").to_owned(),
            key,
            resource_version,
            labels,
            fields,
            deletion,
            has_finalizers,
            json: Bytes::from(json),
        })
    }

    /// The object as a JSON value.
    pub fn value(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.json).map_err(|e| {
            ApiError::new(
                Reason::InternalError,
                format!("stored object unreadable: {e}"),
            )
        })
    }

    /// A selectable field's value by its label (`status.phase`), for field selectors.
    pub fn field(&self, label: &str) -> Option<String> {
        if label == "metadata.name" {
            return Some(self.key.name.clone());
        }
        if label == "metadata.namespace" {
            return Some(self.key.namespace.clone());
        }
        let at = self
            .key
            .resource
            .selectable_fields()
            .iter()
            .position(|field| *field == label)?;
        self.fields.get(at).cloned()
    }
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn field_value(value: &Value, path: &str) -> String {
    let mut at = value;
    for part in path.split('.') {
        match at.get(part) {
            Some(next) => at = next,
            None => return String::new(),
        }
    }
    match at {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// Metadata fields only the server writes; a client's values are dropped on create.
const SERVER_OWNED: [&str; 6] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// Checks a create body and fills in what the server sets, except `resourceVersion`.
///
/// `namespace` is the request's namespace ("" for cluster-scoped). `from_api` is false for
/// the control API, which may create objects with a status already set.
pub fn prepare_create(
    resource: Resource,
    namespace: &str,
    mut value: Value,
    from_api: bool,
) -> Result<Value, ApiError> {
    let object = typed(resource, &mut value)?;
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    for field in SERVER_OWNED {
        meta.remove(field);
    }
    if resource.namespaced() {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(namespace));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let named = meta
        .get("name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    if !named {
        let Some(prefix) = meta.get("generateName").and_then(Value::as_str) else {
            return Err(ApiError::invalid(
                resource.group(),
                resource.kind(),
                "",
                vec![(
                    "metadata.name".into(),
                    "Required value: name or generateName is required".into(),
                )],
            ));
        };
        let name = format!("{prefix}{}", random_suffix());
        meta.insert("name".into(), json!(name));
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    if resource == Resource::Namespaces {
        let name = meta.get("name").cloned().unwrap_or_default();
        let labels = meta
            .entry("labels")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert("kubernetes.io/metadata.name".into(), name);
        }
    }
    default_spec_and_status(resource, object, from_api);
    validate(resource, &value)?;
    Ok(value)
}

/// Checks a replacement body against the stored object and carries over what clients cannot
/// change: identity, timestamps, and (for a resource with a status subresource) the side the
/// request may not write.
pub fn prepare_update(
    resource: Resource,
    old: &Value,
    mut value: Value,
    status_subresource: bool,
) -> Result<Value, ApiError> {
    let old_meta = old.get("metadata").cloned().unwrap_or_default();
    let old_name = old_meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let object = typed(resource, &mut value)?;
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    if let Some(name) = meta.get("name").and_then(Value::as_str)
        && name != old_name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({old_name})"
        )));
    }
    if let Some(ns) = meta.get("namespace").and_then(Value::as_str)
        && resource.namespaced()
        && Some(ns) != old_meta.get("namespace").and_then(Value::as_str)
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generateName",
    ] {
        match old_meta.get(field) {
            Some(kept) => meta.insert(field.into(), kept.clone()),
            None => meta.remove(field),
        };
    }
    if resource.has_status_subresource() {
        if status_subresource {
            // A status write changes only the status.
            let mut merged = old.clone();
            if let Some(merged) = merged.as_object_mut() {
                match object.remove("status") {
                    Some(status) => merged.insert("status".into(), status),
                    None => merged.remove("status"),
                };
            }
            validate(resource, &merged)?;
            return Ok(merged);
        }
        // The main resource ignores status changes.
        match old.get("status") {
            Some(status) => object.insert("status".into(), status.clone()),
            None => object.remove("status"),
        };
    }
    validate(resource, &value)?;
    Ok(value)
}

fn value_rv(value: &Value) -> Option<u64> {
    value.as_str().and_then(|s| s.parse().ok())
}

/// The body as an object of this resource's kind, `kind` and `apiVersion` set, `metadata`
/// present (an object, or the caller reports it is not).
fn typed(resource: Resource, value: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    check_type(resource, value)?;
    let Some(object) = value.as_object_mut() else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    object.insert("kind".into(), json!(resource.kind()));
    object.insert("apiVersion".into(), json!(resource.api_version()));
    object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    Ok(object)
}

fn check_type(resource: Resource, value: &Value) -> Result<(), ApiError> {
    if let Some(kind) = value.get("kind").and_then(Value::as_str)
        && kind != resource.kind()
    {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): kind {kind:?} does not match",
            resource.kind()
        )));
    }
    if let Some(version) = value.get("apiVersion").and_then(Value::as_str)
        && version != resource.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({version}) does not match the expected API version ({})",
            resource.api_version()
        )));
    }
    Ok(())
}

fn default_spec_and_status(resource: Resource, object: &mut Map<String, Value>, from_api: bool) {
    match resource {
        Resource::Pods => {
            if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                for (field, default) in [
                    ("restartPolicy", json!("Always")),
                    ("terminationGracePeriodSeconds", json!(30)),
                    ("dnsPolicy", json!("ClusterFirst")),
                    ("schedulerName", json!("default-scheduler")),
                    ("serviceAccountName", json!("default")),
                ] {
                    spec.entry(field).or_insert(default);
                }
                for list in ["initContainers", "containers"] {
                    if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
                        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
                            default_container(container);
                        }
                    }
                }
            }
            // Status comes from the kubelet, never from a create.
            if from_api || !object.contains_key("status") {
                object.insert(
                    "status".into(),
                    json!({ "phase": "Pending", "qosClass": "BestEffort" }),
                );
            }
        }
        Resource::Namespaces => {
            object.insert("spec".into(), json!({ "finalizers": ["kubernetes"] }));
            object.insert("status".into(), json!({ "phase": "Active" }));
        }
        Resource::Leases => {
            object.entry("spec").or_insert_with(|| json!({}));
        }
        // No schema, so no defaults; with a status subresource a create sets no status.
        Resource::Custom(custom) => {
            if from_api && custom.status {
                object.remove("status");
            }
        }
    }
}

fn default_container(container: &mut Map<String, Value>) {
    let latest = container
        .get("image")
        .and_then(Value::as_str)
        .is_some_and(|image| {
            !image.rsplit('/').next().unwrap_or(image).contains(':') || image.ends_with(":latest")
        });
    let pull = if latest { "Always" } else { "IfNotPresent" };
    container.entry("imagePullPolicy").or_insert(json!(pull));
    container
        .entry("terminationMessagePath")
        .or_insert(json!("/dev/termination-log"));
    container
        .entry("terminationMessagePolicy")
        .or_insert(json!("File"));
    container.entry("resources").or_insert(json!({}));
}

/// The field-level checks of kube-apiserver that matter to clients: names, labels, containers.
pub fn validate(resource: Resource, value: &Value) -> Result<(), ApiError> {
    let meta = value.get("metadata").unwrap_or(&Value::Null);
    let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
    let mut causes = Vec::new();
    let name_ok = match resource {
        Resource::Namespaces => is_dns_label(name),
        Resource::Pods | Resource::Leases | Resource::Custom(_) => is_dns_subdomain(name),
    };
    if !name_ok {
        causes.push((
            "metadata.name".to_owned(),
            format!("Invalid value: {name:?}: a lowercase RFC 1123 name must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    for (map, what) in [("labels", "labels"), ("annotations", "annotations")] {
        let Some(entries) = meta.get(map) else {
            continue;
        };
        let Some(entries) = entries.as_object() else {
            causes.push((
                format!("metadata.{what}"),
                "Invalid value: must be a map of strings".to_owned(),
            ));
            continue;
        };
        for (key, entry) in entries {
            if let Err(why) = validate_label_key(key) {
                causes.push((
                    format!("metadata.{what}"),
                    format!("Invalid value: {key:?}: {why}"),
                ));
            }
            match entry.as_str() {
                Some(text) if map == "labels" => {
                    if let Err(why) = validate_label_value(text) {
                        causes.push((
                            "metadata.labels".to_owned(),
                            format!("Invalid value: {text:?}: {why}"),
                        ));
                    }
                }
                Some(_) => {}
                None => causes.push((
                    format!("metadata.{what}"),
                    format!("Invalid value: {key:?}: values must be strings"),
                )),
            }
        }
    }
    if resource == Resource::Pods {
        let containers = value
            .get("spec")
            .and_then(|s| s.get("containers"))
            .and_then(Value::as_array);
        match containers {
            Some(list) if !list.is_empty() => {
                for (i, container) in list.iter().enumerate() {
                    let cname = container
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if !is_dns_label(cname) {
                        causes.push((
                            format!("spec.containers[{i}].name"),
                            format!(
                                "Invalid value: {cname:?}: a lowercase RFC 1123 label is required"
                            ),
                        ));
                    }
                    if container
                        .get("image")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        causes.push((
                            format!("spec.containers[{i}].image"),
                            "Required value".to_owned(),
                        ));
                    }
                }
            }
            _ => causes.push(("spec.containers".to_owned(), "Required value".to_owned())),
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            resource.group(),
            resource.kind(),
            name,
            causes,
        ))
    }
}

/// Sets `metadata.resourceVersion`.
pub fn set_resource_version(value: &mut Value, rv: u64) {
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

/// `metadata.resourceVersion` as a number, if the object carries one.
pub fn resource_version_of(value: &Value) -> Option<u64> {
    value
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .and_then(value_rv)
}

/// Now, to the second, as Kubernetes writes timestamps.
pub fn now_rfc3339() -> String {
    rfc3339(Timestamp::now())
}

/// A timestamp to the second, as Kubernetes writes them.
pub fn rfc3339(at: Timestamp) -> String {
    Timestamp::from_second(at.as_second())
        .map(|t| t.to_string())
        .unwrap_or_else(|_| at.to_string())
}

/// Five characters from the alphabet kube-apiserver uses for `generateName`.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(5)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

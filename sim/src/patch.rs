//! The patch types kubectl sends: JSON merge, strategic merge, JSON patch, and apply (whose
//! ownership rules live in `apply`).

use serde_json::{Map, Value};

use crate::status::{ApiError, Reason};

/// A patch type, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json`: merge, with lists merged by key.
    Strategic,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/apply-patch+yaml`: server-side apply, read as JSON (YAML's JSON subset).
    Apply,
}

impl PatchType {
    /// The patch type of a `Content-Type`, or 415 for one the simulator does not serve.
    pub fn from_content_type(content_type: &str) -> Result<PatchType, ApiError> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        match media {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/json-patch+json" => Ok(PatchType::Json),
            crate::apply::APPLY_PATCH => Ok(PatchType::Apply),
            other => Err(ApiError::new(
                Reason::UnsupportedMediaType,
                format!(
                    "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                ),
            )),
        }
    }
}

/// A patch body as JSON, or 400.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

/// Applies a merge, strategic or JSON patch body to an object; a malformed patch is a 400, a
/// failing JSON patch a 422. An apply patch is `apply::apply`'s.
pub fn apply(patch_type: PatchType, target: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let patch = decode(body)?;
    let mut patched = target.clone();
    match patch_type {
        PatchType::Apply => {
            return Err(ApiError::bad_request(
                "an apply patch needs a field manager: it is applied with ownership",
            ));
        }
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(&mut patched, &patch);
        }
        PatchType::Strategic => {
            let Value::Object(patch) = patch else {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            };
            strategic_merge_map(&mut patched, &patch)?;
        }
        PatchType::Json => {
            let operations: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: {e}")))?;
            json_patch::patch(&mut patched, &operations).map_err(|e| {
                ApiError::new(
                    Reason::Invalid,
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
        }
    }
    Ok(patched)
}

/// The merge key of a list field, as the core/v1 and meta/v1 types declare it.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "resourceClaims" => Some("name"),
        "ports" => Some("containerPort"),
        "volumeMounts" => Some("mountPath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        _ => None,
    }
}

/// List fields whose primitive values merge as a set rather than replace.
fn merges_primitives(field: &str) -> bool {
    field == "finalizers"
}

fn strategic_merge_map(target: &mut Value, patch: &Map<String, Value>) -> Result<(), ApiError> {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replacement = patch.clone();
        replacement.remove("$patch");
        *target = Value::Object(replacement);
        return Ok(());
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(object) = target else {
        return Ok(());
    };
    for (key, value) in patch {
        if key == "$patch" || key.starts_with("$setElementOrder/") || key == "$retainKeys" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(removed)) =
                (object.get_mut(field), value)
            {
                items.retain(|item| !removed.contains(item));
            }
            continue;
        }
        match value {
            Value::Null => {
                object.remove(key);
            }
            Value::Object(inner) => {
                if inner.get("$patch").and_then(Value::as_str) == Some("delete") {
                    object.remove(key);
                } else {
                    strategic_merge_map(object.entry(key.clone()).or_insert(Value::Null), inner)?;
                }
            }
            Value::Array(items) => {
                let merged = merge_list(key, object.get(key), items)?;
                object.insert(key.clone(), merged);
            }
            scalar => {
                object.insert(key.clone(), scalar.clone());
            }
        }
    }
    if let Some(Value::Array(retained)) = patch.get("$retainKeys") {
        object.retain(|key, _| retained.iter().any(|r| r.as_str() == Some(key)));
    }
    Ok(())
}

fn merge_list(field: &str, current: Option<&Value>, patch: &[Value]) -> Result<Value, ApiError> {
    let current = match current {
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    if patch
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        let kept = patch
            .iter()
            .filter(|item| item.get("$patch").is_none())
            .cloned()
            .collect();
        return Ok(Value::Array(kept));
    }
    if merges_primitives(field) {
        let mut merged = current;
        for item in patch {
            if !merged.contains(item) {
                merged.push(item.clone());
            }
        }
        return Ok(Value::Array(merged));
    }
    let Some(key) = merge_key(field) else {
        return Ok(Value::Array(patch.to_vec()));
    };
    let mut merged = current;
    for item in patch {
        let Value::Object(fields) = item else {
            return Err(ApiError::bad_request(format!(
                "strategic merge patch: {field} items must be objects with {key:?}"
            )));
        };
        let wanted = fields.get(key);
        let found = merged
            .iter()
            .position(|existing| existing.get(key) == wanted);
        let deleting = fields.get("$patch").and_then(Value::as_str) == Some("delete");
        match (found, deleting) {
            (Some(at), true) => {
                merged.remove(at);
            }
            (None, true) => {}
            (Some(at), false) => strategic_merge_map(&mut merged[at], fields)?,
            (None, false) => {
                let mut fresh = Value::Object(Map::new());
                strategic_merge_map(&mut fresh, fields)?;
                merged.push(fresh);
            }
        }
    }
    Ok(Value::Array(merged))
}

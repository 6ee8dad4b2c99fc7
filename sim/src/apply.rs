//! Server-side apply: who owns which field (`metadata.managedFields`), and the conflicts
//! between field managers that leader election through a Lease relies on.
//!
//! The model is the API server's, cut to what clients of the simulator use: a field is a
//! path to a value that is not an object (lists are atomic), an apply owns exactly the
//! fields it sends, a write of any other kind takes the fields it changes, and an apply that
//! would change a field another manager owns is refused with a 409 unless forced. Ownership
//! is recorded once an object has been applied to; objects only ever written otherwise carry
//! no `managedFields`, which keeps the pods the ingest reads as small as before.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::object::now_rfc3339;
use crate::status::{ApiError, Reason};

/// The content type of an apply patch.
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// Who writes, as the request names it: `?fieldManager=` and, for an apply, `?force=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldManager {
    /// The manager's name; clients that send none are recorded as `unknown`.
    pub name: String,
    /// An apply that takes conflicting fields instead of failing.
    pub force: bool,
}

impl FieldManager {
    /// The writer of a request without a `fieldManager`.
    pub fn unknown() -> FieldManager {
        FieldManager {
            name: "unknown".into(),
            force: false,
        }
    }
}

/// A field: the keys from the object's root to a value that is not an object.
type Path = Vec<String>;

/// The two operations the API server records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: Operation,
    api_version: String,
    fields: BTreeSet<Path>,
}

/// Top-level and `metadata` fields the server sets, which nobody owns.
const UNOWNED_METADATA: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// Applies `applied` as `manager` to `live` (`None` for an object that does not exist yet):
/// the object with the applied fields set, the fields this manager applied before and no
/// longer does removed (unless another manager owns them too), and its ownership recorded.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &FieldManager,
) -> Result<Value, ApiError> {
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "an apply patch must be a JSON object",
        ));
    }
    let empty = json!({});
    let live = live.unwrap_or(&empty);
    let mut entries = entries(live);
    let wanted = fields(applied);
    let conflicts: Vec<(String, &Path)> = wanted
        .iter()
        .flat_map(|path| {
            entries
                .iter()
                .filter(|e| e.manager != manager.name && e.fields.contains(path))
                .filter(|_| value_at(live, path) != value_at(applied, path))
                .map(move |e| (e.manager.clone(), path))
        })
        .collect();
    if !conflicts.is_empty() && !manager.force {
        return Err(conflict_error(&conflicts));
    }
    let mut object = live.clone();
    let previous = entries
        .iter()
        .position(|e| e.manager == manager.name && e.operation == Operation::Apply)
        .map(|at| entries.remove(at));
    if let Some(previous) = previous {
        for path in previous.fields.difference(&wanted) {
            let shared = entries.iter().any(|e| e.fields.contains(path));
            if !shared {
                remove_at(&mut object, path);
            }
        }
    }
    for path in &wanted {
        if let Some(value) = value_at(applied, path) {
            set_at(&mut object, path, value.clone());
        }
    }
    for (_, path) in &conflicts {
        for entry in &mut entries {
            entry.fields.remove(*path);
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    entries.push(Entry {
        manager: manager.name.clone(),
        operation: Operation::Apply,
        api_version: api_version(applied),
        fields: wanted,
    });
    for key in ["apiVersion", "kind"] {
        if let Some(value) = applied.get(key) {
            set_at(&mut object, &[key.to_owned()], value.clone());
        }
    }
    write_entries(&mut object, &entries);
    Ok(object)
}

/// Records a write that is not an apply (a PUT or a patch) on an object that has ownership:
/// `manager` takes the fields it changed, and fields it removed are nobody's. A request's own
/// `managedFields` are ignored.
pub fn record_update(old: &Value, new: &mut Value, manager: &FieldManager) {
    let mut entries = entries(old);
    if entries.is_empty() {
        if let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        return;
    }
    let after = fields(new);
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|path| value_at(old, path) != value_at(new, path))
        .cloned()
        .collect();
    for entry in &mut entries {
        entry
            .fields
            .retain(|path| after.contains(path) && !changed.contains(path));
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.manager == manager.name && e.operation == Operation::Update)
        {
            Some(entry) => entry.fields.extend(changed),
            None => entries.push(Entry {
                manager: manager.name.clone(),
                operation: Operation::Update,
                api_version: api_version(new),
                fields: changed,
            }),
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    write_entries(new, &entries);
}

fn conflict_error(conflicts: &[(String, &Path)]) -> ApiError {
    let listed: Vec<String> = conflicts
        .iter()
        .map(|(manager, path)| format!("conflict with \"{manager}\": .{}", path.join(".")))
        .collect();
    let count = conflicts.len();
    let plural = if count == 1 { "" } else { "s" };
    ApiError::new(
        Reason::Conflict,
        format!(
            "Apply failed with {count} conflict{plural}: {}",
            listed.join("\n")
        ),
    )
}

fn api_version(object: &Value) -> String {
    object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The fields of an object: every path to a value that is not an object, except identity
/// and what the server sets.
fn fields(object: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    let Some(root) = object.as_object() else {
        return out;
    };
    for (key, value) in root {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                if let Some(meta) = value.as_object() {
                    for (field, inner) in meta {
                        if !UNOWNED_METADATA.contains(&field.as_str()) {
                            collect(inner, vec!["metadata".into(), field.clone()], &mut out);
                        }
                    }
                }
            }
            _ => collect(value, vec![key.clone()], &mut out),
        }
    }
    out
}

fn collect(value: &Value, path: Path, out: &mut BTreeSet<Path>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                let mut deeper = path.clone();
                deeper.push(key.clone());
                collect(inner, deeper, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

fn value_at<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |at, key| at.get(key))
}

fn set_at(value: &mut Value, path: &[String], new: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = value;
    for key in parents {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(map) = at else { return };
        at = map
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !at.is_object() {
        *at = Value::Object(Map::new());
    }
    if let Value::Object(map) = at {
        map.insert(last.clone(), new);
    }
}

fn remove_at(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = value;
    for key in parents {
        match at.get_mut(key) {
            Some(inner) => at = inner,
            None => return,
        }
    }
    if let Value::Object(map) = at {
        map.remove(last);
    }
}

/// The recorded entries of an object; entries the simulator cannot read are dropped.
fn entries(object: &Value) -> Vec<Entry> {
    let Some(Value::Array(items)) = object.pointer("/metadata/managedFields") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let manager = item.get("manager")?.as_str()?.to_owned();
            let operation = match item.get("operation")?.as_str()? {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            let mut fields = BTreeSet::new();
            decode_fields(item.get("fieldsV1")?, &mut Vec::new(), &mut fields);
            Some(Entry {
                manager,
                operation,
                api_version: item
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                fields,
            })
        })
        .collect()
}

/// `FieldsV1`: nested `"f:<key>"` objects, `{}` at a field.
fn decode_fields(set: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = set.as_object() else { return };
    for (key, inner) in map {
        let Some(name) = key.strip_prefix("f:") else {
            continue;
        };
        path.push(name.to_owned());
        match inner.as_object() {
            Some(children) if !children.is_empty() => decode_fields(inner, path, out),
            _ => {
                out.insert(path.clone());
            }
        }
        path.pop();
    }
}

fn encode_fields(fields: &BTreeSet<Path>) -> Value {
    let mut root = Value::Object(Map::new());
    for path in fields {
        let keyed: Path = path.iter().map(|key| format!("f:{key}")).collect();
        set_at(&mut root, &keyed, json!({}));
    }
    root
}

fn write_entries(object: &mut Value, entries: &[Entry]) {
    let time = now_rfc3339();
    let managed: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "manager": e.manager,
                "operation": e.operation.as_str(),
                "apiVersion": e.api_version,
                "time": time,
                "fieldsType": "FieldsV1",
                "fieldsV1": encode_fields(&e.fields),
            })
        })
        .collect();
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("managedFields".into(), Value::Array(managed));
    } else {
        set_at(
            object,
            &["metadata".to_owned(), "managedFields".to_owned()],
            Value::Array(managed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(name: &str, force: bool) -> FieldManager {
        FieldManager {
            name: name.into(),
            force,
        }
    }

    fn lease(holder: Option<&str>) -> Value {
        let mut spec = json!({"leaseDurationSeconds": 10});
        if let Some(holder) = holder {
            spec["holderIdentity"] = json!(holder);
        }
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": spec})
    }

    #[test]
    fn a_second_applier_of_a_field_someone_owns_with_another_value_conflicts() {
        let created = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {}});
        let a = apply(Some(&created), &lease(Some("a")), &manager("a", false)).unwrap();
        assert_eq!(a["spec"]["holderIdentity"], "a");

        let refused = apply(Some(&a), &lease(Some("b")), &manager("b", false)).unwrap_err();
        assert_eq!(refused.reason, Reason::Conflict);
        assert!(
            refused
                .message
                .contains("conflict with \"a\": .spec.holderIdentity"),
            "{}",
            refused.message
        );

        // The same value is shared, not a conflict.
        let shared = apply(Some(&a), &lease(Some("a")), &manager("b", false)).unwrap();
        assert_eq!(entries(&shared).len(), 2);

        // Forced, b takes the field and a keeps only what b did not change.
        let forced = apply(Some(&a), &lease(Some("b")), &manager("b", true)).unwrap();
        assert_eq!(forced["spec"]["holderIdentity"], "b");
        let owners = entries(&forced);
        let a_fields = &owners.iter().find(|e| e.manager == "a").unwrap().fields;
        assert!(!a_fields.contains(&vec!["spec".to_owned(), "holderIdentity".to_owned()]));
    }

    #[test]
    fn a_field_removed_by_an_update_frees_it_for_the_next_applier() {
        let a = apply(None, &lease(Some("a")), &manager("a", false)).unwrap();
        let mut released = a.clone();
        released["spec"]
            .as_object_mut()
            .unwrap()
            .remove("holderIdentity");
        record_update(&a, &mut released, &manager("b", false));
        let b = apply(Some(&released), &lease(Some("b")), &manager("b", false)).unwrap();
        assert_eq!(b["spec"]["holderIdentity"], "b");
    }

    #[test]
    fn an_update_takes_the_fields_it_changes_and_an_apply_drops_what_it_no_longer_sends() {
        let a = apply(None, &lease(Some("a")), &manager("a", false)).unwrap();
        let mut renewed = a.clone();
        renewed["spec"]["leaseDurationSeconds"] = json!(20);
        record_update(&a, &mut renewed, &manager("c", false));
        let c = entries(&renewed)
            .into_iter()
            .find(|e| e.manager == "c")
            .unwrap();
        assert_eq!(c.operation, Operation::Update);
        assert_eq!(
            c.fields.into_iter().collect::<Vec<_>>(),
            vec![vec!["spec".to_owned(), "leaseDurationSeconds".to_owned()]]
        );

        let without_holder = lease(None);
        let dropped = apply(Some(&renewed), &without_holder, &manager("a", true)).unwrap();
        assert!(dropped["spec"].get("holderIdentity").is_none());
        assert_eq!(dropped["spec"]["leaseDurationSeconds"], 10);
    }

    #[test]
    fn an_object_never_applied_to_records_nothing() {
        let old = lease(Some("a"));
        let mut new = lease(Some("b"));
        record_update(&old, &mut new, &manager("x", false));
        assert!(new["metadata"].get("managedFields").is_none());
    }
}

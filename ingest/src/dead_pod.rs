//! What a dead letter keeps of an object the ingest could not use: its `apiVersion`, `kind`,
//! `metadata` and `status`, with the reason beside it, and never its `spec`. A pod's spec holds
//! env values and volumes (secrets, often), and the dead-letter stream is readable by more
//! users than the cluster's pods are; `metadata.managedFields` and the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation repeat the spec, so they go
//! too.

use serde_json::{Map, Value};

/// The annotation kubectl writes with the whole object it applied, spec included.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The fields of `object` a dead letter keeps, as JSON bytes. What is not a JSON object is
/// kept as `null`: its text could hold anything.
pub fn kept(object: &str) -> Vec<u8> {
    let kept = match serde_json::from_str::<Value>(object) {
        Ok(Value::Object(mut fields)) => {
            let mut kept = Map::new();
            for name in ["apiVersion", "kind", "metadata", "status"] {
                if let Some(value) = fields.remove(name) {
                    kept.insert(name.to_owned(), value);
                }
            }
            if let Some(Value::Object(metadata)) = kept.get_mut("metadata") {
                metadata.remove("managedFields");
                if let Some(Value::Object(annotations)) = metadata.get_mut("annotations") {
                    annotations.remove(LAST_APPLIED);
                }
            }
            Value::Object(kept)
        }
        _ => Value::Null,
    };
    serde_json::to_vec(&kept).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_metadata_and_status_and_never_the_spec() {
        let pod = r#"{"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":"p","uid":"u","annotations":{"dag_id":"d",
              "kubectl.kubernetes.io/last-applied-configuration":"{\"spec\":{\"containers\":[{\"env\":[{\"name\":\"PASSWORD\",\"value\":\"hunter2\"}]}]}}"},
              "managedFields":[{"manager":"kubectl","fieldsV1":{"f:spec":{}}}]},
            "spec":{"containers":[{"name":"base","env":[{"name":"PASSWORD","value":"hunter2"}]}],
                    "volumes":[{"name":"s","secret":{"secretName":"db"}}]},
            "status":{"phase":"Failed"}}"#;
        let kept: Value = serde_json::from_slice(&kept(pod)).unwrap();
        assert_eq!(kept["metadata"]["annotations"]["dag_id"], "d");
        assert_eq!(kept["status"]["phase"], "Failed");
        assert_eq!(kept["kind"], "Pod");
        let text = kept.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("secretName"), "{text}");
        assert!(kept.get("spec").is_none());
        assert!(kept["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn what_is_not_an_object_is_kept_as_null() {
        assert_eq!(kept("[1,2]"), b"null");
        assert_eq!(kept("not json"), b"null");
    }
}

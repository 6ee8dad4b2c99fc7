//! Spark driver pods and SparkApplications in Kubernetes JSON (kubectl's `-o json`, watch
//! events or lists), split from the worker pods and projected by the ingest's own
//! `spark::projection` into the events `podstream_rules::spark` takes.

use podstream_ingest::spark::projection::{project_spark, spark_kind};
use podstream_proto::v1::{EventType, PodRef, SparkEvent};
use serde_json::Value;

/// What a JSON value holds, split for `decide`: its Spark objects, each read or refused
/// with the reason and its object, and the values left for the worker-pod path.
#[derive(Debug, Default)]
pub struct SparkSplit<'v> {
    /// The Spark objects' events.
    pub items: Vec<Result<SparkEvent, (String, PodRef)>>,
    /// The other objects of a list.
    pub others: Vec<&'v Value>,
}

/// The Spark objects in `value` (a watch event, an object or a list) and the rest; `None`
/// when `value` holds no Spark object at all.
pub fn spark_items(value: &Value) -> Option<SparkSplit<'_>> {
    let objects: Vec<(EventType, &Value)> = match (value.get("type"), value.get("object")) {
        (Some(kind), Some(object)) => {
            let kind = match kind.as_str() {
                Some("DELETED") => EventType::Deleted,
                Some("ADDED") => EventType::Added,
                _ => EventType::Modified,
            };
            vec![(kind, object)]
        }
        _ => match value.get("items").and_then(Value::as_array) {
            Some(items) => items.iter().map(|item| (EventType::Added, item)).collect(),
            None => vec![(EventType::Added, value)],
        },
    };
    let mut split = SparkSplit::default();
    for (event_type, object) in objects {
        match spark_kind(object) {
            Some(kind) => split.items.push(
                project_spark(kind, event_type, object)
                    .map_err(|unusable| (unusable.reason, unusable.object)),
            ),
            None => split.others.push(object),
        }
    }
    (!split.items.is_empty()).then_some(split)
}

#[cfg(test)]
mod tests {
    use podstream_proto::v1::spark_event::Object;
    use serde_json::json;

    use super::spark_items;

    #[test]
    fn spark_objects_are_split_from_the_rest_of_a_list() {
        let list = json!({ "kind": "List", "items": [
            { "kind": "Pod", "metadata": { "name": "w", "uid": "w", "labels": { "airflow-worker": "1" } } },
            { "kind": "Pod", "metadata": { "name": "d", "namespace": "airflow", "uid": "u1",
              "labels": { "spark-role": "driver", "dag_id": "etl", "task_id": "t", "run_id": "r",
                          "try_number": "1", "spark_kubernetes_operator": "True" } } },
            { "kind": "Pod", "metadata": { "name": "p", "uid": "u2",
              "labels": { "spark-role": "driver", "spark_kubernetes_operator": "True" } } },
            // A driver Airflow did not launch: not a Spark object to decide, as the ingest
            // and the provider's find_spark_job select only the operator's.
            { "kind": "Pod", "metadata": { "name": "x", "uid": "u3",
              "labels": { "spark-role": "driver", "dag_id": "etl", "task_id": "t", "run_id": "r",
                          "try_number": "1" } } },
        ] });
        let split = spark_items(&list).unwrap();
        assert_eq!(split.others.len(), 2);
        assert_eq!(split.items.len(), 2);
        assert!(
            matches!(&split.items[0], Ok(event) if matches!(event.object, Some(Object::Driver(_))))
        );
        assert!(
            matches!(&split.items[1], Err((why, pod)) if why.contains("dag_id") && pod.name == "p")
        );
        let worker = json!({ "type": "ADDED", "object": { "kind": "Pod", "metadata": { "labels": { "airflow-worker": "1" } } } });
        assert!(spark_items(&worker).is_none());
    }
}

//! Spark driver pods and SparkApplications in Kubernetes JSON (kubectl's `-o json`, watch
//! events or lists), read into the events of `podstream_processor::spark`. A driver pod is a
//! pod labelled `spark-role=driver` without `airflow-worker`; its task instance is its label
//! tuple as the SparkKubernetesOperator sets it.

use podstream_ingest::projection::phase_named;
use podstream_processor::spark::{ApplicationEvent, DriverEvent, DriverPod};
use podstream_proto::v1::{PodRef, TaskKey};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// One Spark object's event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SparkItem {
    /// A driver pod's.
    Driver(DriverEvent),
    /// A SparkApplication's.
    Application(ApplicationEvent),
}

/// What a JSON value holds, split for `decide`: its Spark objects, each read or refused
/// with the reason and its pod, and the values left for the worker-pod path.
#[derive(Debug, Default)]
pub struct SparkSplit<'v> {
    /// The Spark objects' events.
    pub items: Vec<Result<SparkItem, (String, PodRef)>>,
    /// The other objects of a list.
    pub others: Vec<&'v Value>,
}

/// The Spark objects in `value` (a watch event, an object or a list) and the rest; `None`
/// when `value` holds no Spark object at all.
pub fn spark_items(value: &Value) -> Option<SparkSplit<'_>> {
    let objects: Vec<(bool, &Value)> = match (value.get("type"), value.get("object")) {
        (Some(kind), Some(object)) => vec![(kind.as_str() == Some("DELETED"), object)],
        _ => match value.get("items").and_then(Value::as_array) {
            Some(items) => items.iter().map(|item| (false, item)).collect(),
            None => vec![(false, value)],
        },
    };
    let mut split = SparkSplit::default();
    for (gone, object) in objects {
        match spark_item(object, gone) {
            Some(item) => split.items.push(item),
            None => split.others.push(object),
        }
    }
    (!split.items.is_empty()).then_some(split)
}

fn spark_item(object: &Value, gone: bool) -> Option<Result<SparkItem, (String, PodRef)>> {
    let meta = &object["metadata"];
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    match object["kind"].as_str() {
        Some("SparkApplication") => Some(Ok(SparkItem::Application(ApplicationEvent {
            namespace: text(&meta["namespace"]),
            name: text(&meta["name"]),
            created_unix_ms: unix_ms(&meta["creationTimestamp"]),
            driver: object["status"]["driverInfo"]["podName"]
                .as_str()
                .map(str::to_owned),
            resource_version: text(&meta["resourceVersion"]),
            gone,
        }))),
        Some("Pod") | None => {
            let labels = &meta["labels"];
            let driver = labels["spark-role"].as_str() == Some("driver")
                && labels.get("airflow-worker").is_none();
            if !driver {
                return None;
            }
            let pod = PodRef {
                namespace: text(&meta["namespace"]),
                name: text(&meta["name"]),
                uid: text(&meta["uid"]),
            };
            Some(driver_event(object, pod, gone))
        }
        Some(_) => None,
    }
}

fn driver_event(object: &Value, pod: PodRef, gone: bool) -> Result<SparkItem, (String, PodRef)> {
    let meta = &object["metadata"];
    let labels = &meta["labels"];
    let label = |name: &str| labels[name].as_str();
    let refuse = |why: &str| Err((why.to_owned(), pod.clone()));
    let (Some(dag_id), Some(task_id), Some(run_id)) =
        (label("dag_id"), label("task_id"), label("run_id"))
    else {
        return refuse("a Spark driver pod without the dag_id, task_id and run_id labels");
    };
    let Some(try_number) = label("try_number").and_then(|t| t.parse().ok()) else {
        return refuse("a Spark driver pod without a numeric try_number label");
    };
    let Ok(map_index) = label("map_index").map_or(Ok(-1), str::parse) else {
        return refuse("a Spark driver pod with a map_index label that is not a number");
    };
    if pod.uid.is_empty() {
        return refuse("a Spark driver pod without metadata.uid");
    }
    let application = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|owner| owner["kind"].as_str() == Some("SparkApplication"))
        .and_then(|owner| owner["name"].as_str())
        .or_else(|| label("sparkoperator.k8s.io/app-name"))
        .map(str::to_owned);
    Ok(SparkItem::Driver(DriverEvent {
        task: TaskKey {
            dag_id: dag_id.to_owned(),
            task_id: task_id.to_owned(),
            run_id: run_id.to_owned(),
            map_index,
            try_number,
            ..TaskKey::default()
        },
        facts: DriverPod {
            name: pod.name.clone(),
            phase: phase_named(object["status"]["phase"].as_str()),
            terminating: meta.get("deletionTimestamp").is_some_and(|t| !t.is_null()),
            created_unix_ms: unix_ms(&meta["creationTimestamp"]),
            checked: label("already_checked") == Some("True"),
        },
        application,
        resource_version: meta["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        gone,
        pod,
    }))
}

fn unix_ms(value: &Value) -> Option<i64> {
    let time = OffsetDateTime::parse(value.as_str()?, &Rfc3339).ok()?;
    i64::try_from(time.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{SparkItem, spark_items};

    #[test]
    fn drivers_and_applications_are_read_and_other_objects_left_alone() {
        let driver = json!({
            "type": "ADDED",
            "object": {
                "kind": "Pod",
                "metadata": {
                    "name": "crunch-driver", "namespace": "airflow", "uid": "u1",
                    "resourceVersion": "7", "creationTimestamp": "2026-09-21T14:13:20Z",
                    "labels": { "spark-role": "driver", "dag_id": "etl", "task_id": "crunch",
                                "run_id": "r1", "try_number": "2",
                                "sparkoperator.k8s.io/app-name": "crunch-app" },
                },
                "status": { "phase": "Running" },
            }
        });
        let items = spark_items(&driver).unwrap().items;
        let Ok(SparkItem::Driver(event)) = &items[0] else {
            panic!("{items:?}");
        };
        assert_eq!(event.task.try_number, 2);
        assert_eq!(event.task.map_index, -1);
        assert_eq!(event.application.as_deref(), Some("crunch-app"));
        assert_eq!(event.facts.created_unix_ms, Some(1_790_000_000_000));

        let worker = json!({ "kind": "Pod", "metadata": { "labels": { "airflow-worker": "1", "spark-role": "driver" } } });
        assert!(spark_items(&worker).is_none());
        let unlabelled = json!({ "kind": "Pod", "metadata": { "name": "p", "uid": "u", "labels": { "spark-role": "driver" } } });
        let refused = spark_items(&unlabelled).unwrap().items;
        assert!(
            matches!(&refused[0], Err((why, pod)) if why.contains("dag_id") && pod.name == "p"),
            "{refused:?}"
        );
        let application = json!({
            "type": "DELETED",
            "object": { "kind": "SparkApplication", "metadata": { "name": "crunch-app", "namespace": "airflow" },
                        "status": { "driverInfo": { "podName": "crunch-driver" } } }
        });
        let items = spark_items(&application).unwrap().items;
        let Ok(SparkItem::Application(event)) = &items[0] else {
            panic!("{items:?}");
        };
        assert!(event.gone);
        assert_eq!(event.driver.as_deref(), Some("crunch-driver"));
    }
}

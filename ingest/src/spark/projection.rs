//! A Spark driver pod or a SparkApplication, as Kubernetes JSON, reduced to the
//! `SparkEvent` the choice of driver reads (seed 003, issue 25), or the reason it cannot be.
//!
//! A driver pod is a pod labelled `spark-role=driver` without `airflow-worker`; its task
//! instance is its label tuple as the SparkKubernetesOperator sets it (Airflow's safe label
//! values), never annotations. Spark objects are rare, so they are read whole as JSON: `decide`
//! from kubectl's output, the ingest from its watch of both kinds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use podstream_proto::subject::SparkKind;
use podstream_proto::v1::spark_event::Object;
use podstream_proto::v1::{EventType, PodRef, SparkApplication, SparkDriver, SparkEvent, TaskKey};
use serde_json::Value;

use crate::projection::phase_named;

/// The label every Spark pod has (`driver` or `executor`).
pub const SPARK_ROLE_LABEL: &str = "spark-role";

/// The label the SparkKubernetesOperator puts on the drivers it launches (`True`).
pub const OPERATOR_LABEL: &str = "spark_kubernetes_operator";

/// The label selector of the driver pods of Airflow-launched Spark jobs: what the ingest
/// watches with `--spark`, and what `decide` takes as a driver ([`spark_kind`]).
pub const DRIVER_SELECTOR: &str = "spark-role=driver,spark_kubernetes_operator=True";

/// A Spark object that cannot give an event: why, and which object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparkUnusable {
    /// What was wrong, in words.
    pub reason: String,
    /// The object (namespace, name, uid as far as they are known).
    pub object: PodRef,
}

/// Which kind of Spark object `object` is, if any: a SparkApplication, or a driver pod
/// (a pod labelled `spark-role=driver` and `spark_kubernetes_operator=True` without
/// `airflow-worker`; worker pods are never Spark objects, whatever else they carry).
pub fn spark_kind(object: &Value) -> Option<SparkKind> {
    match object["kind"].as_str() {
        Some("SparkApplication") => Some(SparkKind::Application),
        Some("Pod") | None => {
            let labels = &object["metadata"]["labels"];
            (labels[SPARK_ROLE_LABEL].as_str() == Some("driver")
                && labels[OPERATOR_LABEL].as_str() == Some("True")
                && labels.get(crate::projection::OWNER_LABEL).is_none())
            .then_some(SparkKind::Driver)
        }
        Some(_) => None,
    }
}

/// The event of one Spark object of `kind` seen in a watch event of type `event_type`.
pub fn project_spark(
    kind: SparkKind,
    event_type: EventType,
    object: &Value,
) -> Result<SparkEvent, SparkUnusable> {
    let meta = &object["metadata"];
    let reference = PodRef {
        namespace: text(&meta["namespace"]),
        name: text(&meta["name"]),
        uid: text(&meta["uid"]),
    };
    let refuse = |reason: &str| {
        Err(SparkUnusable {
            reason: reason.to_owned(),
            object: reference.clone(),
        })
    };
    if reference.uid.is_empty() {
        return refuse("a Spark object without metadata.uid");
    }
    let object = match kind {
        SparkKind::Application => Object::Application(SparkApplication {
            creation_unix_ms: unix_ms(&meta["creationTimestamp"]),
            driver: text(&object["status"]["driverInfo"]["podName"]),
            application: Some(reference),
        }),
        SparkKind::Driver => match driver(object, reference.clone()) {
            Ok(driver) => Object::Driver(driver),
            Err(reason) => return refuse(reason),
        },
    };
    Ok(SparkEvent {
        r#type: event_type as i32,
        resource_version: text(&meta["resourceVersion"]),
        synthesized: false,
        object: Some(object),
    })
}

fn driver(object: &Value, pod: PodRef) -> Result<SparkDriver, &'static str> {
    let meta = &object["metadata"];
    let labels = &meta["labels"];
    let label = |name: &str| labels[name].as_str();
    let (Some(dag_id), Some(task_id), Some(run_id)) =
        (label("dag_id"), label("task_id"), label("run_id"))
    else {
        return Err("a Spark driver pod without the dag_id, task_id and run_id labels");
    };
    let Some(try_number) = label("try_number").and_then(|t| t.parse().ok()) else {
        return Err("a Spark driver pod without a numeric try_number label");
    };
    let Ok(map_index) = label("map_index").map_or(Ok(-1), str::parse) else {
        return Err("a Spark driver pod with a map_index label that is not a number");
    };
    let application = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|owner| owner["kind"].as_str() == Some("SparkApplication"))
        .and_then(|owner| owner["name"].as_str())
        .or_else(|| label("sparkoperator.k8s.io/app-name"))
        .unwrap_or_default()
        .to_owned();
    Ok(SparkDriver {
        task: Some(TaskKey {
            dag_id: dag_id.to_owned(),
            task_id: task_id.to_owned(),
            run_id: run_id.to_owned(),
            map_index,
            try_number,
            ..TaskKey::default()
        }),
        phase: phase_named(object["status"]["phase"].as_str()) as i32,
        terminating: meta.get("deletionTimestamp").is_some_and(|t| !t.is_null()),
        creation_unix_ms: unix_ms(&meta["creationTimestamp"]),
        checked: label("already_checked") == Some("True"),
        application,
        pod: Some(pod),
    })
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

fn unix_ms(value: &Value) -> Option<i64> {
    let time: Time = serde_json::from_value(value.clone()).ok()?;
    Some(crate::projection::unix_ms(&time))
}

#[cfg(test)]
mod tests {
    use podstream_proto::subject::SparkKind;
    use podstream_proto::v1::spark_event::Object;
    use podstream_proto::v1::{EventType, Phase};
    use serde_json::json;

    use super::{project_spark, spark_kind};

    #[test]
    fn a_driver_pod_is_its_labels_and_its_application() {
        let pod = json!({
            "kind": "Pod",
            "metadata": {
                "name": "crunch-driver", "namespace": "airflow", "uid": "u1",
                "resourceVersion": "7", "creationTimestamp": "2026-09-21T14:13:20Z",
                "deletionTimestamp": "2026-09-21T14:20:00Z",
                "labels": { "spark-role": "driver", "dag_id": "etl", "task_id": "crunch",
                            "run_id": "r1", "try_number": "2", "already_checked": "True",
                            "spark_kubernetes_operator": "True",
                            "sparkoperator.k8s.io/app-name": "crunch-app" },
            },
            "status": { "phase": "Running" },
        });
        assert_eq!(spark_kind(&pod), Some(SparkKind::Driver));
        // A driver Airflow's operator did not launch is no Spark object of ours.
        let mut foreign = pod.clone();
        foreign["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("spark_kubernetes_operator");
        assert_eq!(spark_kind(&foreign), None);
        let event = project_spark(SparkKind::Driver, EventType::Added, &pod).unwrap();
        assert_eq!(event.resource_version, "7");
        let Some(Object::Driver(driver)) = event.object else {
            panic!("not a driver: {event:?}");
        };
        let task = driver.task.clone().unwrap();
        assert_eq!((task.try_number, task.map_index), (2, -1));
        assert_eq!(driver.application, "crunch-app");
        assert_eq!(driver.creation_unix_ms, Some(1_790_000_000_000));
        assert!(driver.terminating && driver.checked);
        assert_eq!(driver.phase(), Phase::Running);
    }

    #[test]
    fn an_owner_reference_names_the_application_before_the_label() {
        let pod = json!({
            "metadata": {
                "name": "d", "namespace": "airflow", "uid": "u1",
                "ownerReferences": [{ "kind": "SparkApplication", "name": "owner-app" }],
                "labels": { "spark-role": "driver", "dag_id": "etl", "task_id": "t",
                            "run_id": "r", "try_number": "1", "map_index": "3",
                            "sparkoperator.k8s.io/app-name": "label-app" },
            },
        });
        let event = project_spark(SparkKind::Driver, EventType::Modified, &pod).unwrap();
        let Some(Object::Driver(driver)) = event.object else {
            panic!("not a driver: {event:?}");
        };
        assert_eq!(driver.application, "owner-app");
        assert_eq!(driver.task.unwrap().map_index, 3);
        assert_eq!(driver.creation_unix_ms, None);
    }

    #[test]
    fn what_is_not_a_spark_object_or_cannot_be_read() {
        let worker = json!({ "kind": "Pod", "metadata": { "labels": { "airflow-worker": "1", "spark-role": "driver" } } });
        assert_eq!(spark_kind(&worker), None);
        let executor = json!({ "metadata": { "labels": { "spark-role": "executor" } } });
        assert_eq!(spark_kind(&executor), None);
        assert_eq!(spark_kind(&json!({ "kind": "ConfigMap" })), None);
        for (pod, reason) in [
            (
                json!({ "metadata": { "name": "p", "uid": "u", "labels": { "spark-role": "driver" } } }),
                "dag_id",
            ),
            (
                json!({ "metadata": { "name": "p", "uid": "u", "labels": {
                    "spark-role": "driver", "dag_id": "d", "task_id": "t", "run_id": "r",
                    "try_number": "one" } } }),
                "try_number",
            ),
            (
                json!({ "metadata": { "name": "p", "uid": "u", "labels": {
                    "spark-role": "driver", "dag_id": "d", "task_id": "t", "run_id": "r",
                    "try_number": "1", "map_index": "x" } } }),
                "map_index",
            ),
            (json!({ "metadata": { "name": "p" } }), "uid"),
        ] {
            let refused = project_spark(SparkKind::Driver, EventType::Added, &pod).unwrap_err();
            assert!(refused.reason.contains(reason), "{refused:?}");
            assert_eq!(refused.object.name, "p");
        }
    }

    #[test]
    fn an_application_is_its_name_and_the_driver_it_tracks() {
        let application = json!({
            "kind": "SparkApplication",
            "metadata": { "name": "crunch-app", "namespace": "airflow", "uid": "a1",
                          "resourceVersion": "9", "creationTimestamp": "2026-09-21T14:13:20Z" },
            "status": { "driverInfo": { "podName": "crunch-driver" } }
        });
        assert_eq!(spark_kind(&application), Some(SparkKind::Application));
        let event =
            project_spark(SparkKind::Application, EventType::Deleted, &application).unwrap();
        assert_eq!(event.r#type(), EventType::Deleted);
        let Some(Object::Application(app)) = event.object else {
            panic!("not an application: {event:?}");
        };
        assert_eq!(app.driver, "crunch-driver");
        assert_eq!(app.application.unwrap().name, "crunch-app");
        assert_eq!(app.creation_unix_ms, Some(1_790_000_000_000));
    }
}

//! Projection of real-shaped Airflow worker pods into `PodEvent`s, and of
//! anything else into a typed error, never a panic.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use podstream_ingest::pod_json::{Projected, project_watch_event};
use podstream_ingest::projection::pod_ref;
use podstream_ingest::watch_json::{WatchItem, read_json, read_value};
use podstream_ingest::watched_pod::WatchedPod;
use podstream_ingest::{ProjectionError, project};
use podstream_proto::v1::{EventType, Phase};
use proptest::prelude::*;
use serde_json::{Value, json};

fn worker_pod() -> Value {
    json!({
        "kind": "Pod",
        "metadata": {
            "name": "etl-load-7c1f", "namespace": "airflow", "uid": "u-1", "resourceVersion": "42",
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"airflow-worker": "7", "dag_id": "etl", "task_id": "load",
                       "run_id": "manual__2026-11-30T1000000000-0a1b2c3d4", "try_number": "2"},
            "annotations": {"dag_id": "etl", "task_id": "load", "run_id": "manual__2026-11-30T10:00:00+00:00",
                            "try_number": "2"}
        },
        "spec": {"containers": [{"name": "base"}, {"name": "sidecar"}], "initContainers": [{"name": "init"}]},
        "status": {"phase": "Pending"}
    })
}

fn project_json(value: Value) -> Result<podstream_proto::PodEvent, ProjectionError> {
    let pod: Pod = serde_json::from_value(value).unwrap();
    project(EventType::Modified, &pod)
}

/// `value` with the field at `pointer` set (created when absent) to `new`.
fn with(mut value: Value, pointer: &str, new: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    value
        .pointer_mut(parent)
        .unwrap()
        .as_object_mut()
        .unwrap()
        .insert(key.to_owned(), new);
    value
}

fn waiting(name: &str, reason: &str) -> Value {
    json!({"name": name, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
           "state": {"waiting": {"reason": reason, "message": "m"}}})
}

#[test]
fn key_comes_from_annotations_never_labels() {
    let event = project_json(worker_pod()).unwrap();
    let task = event.task.clone().unwrap();
    assert_eq!(task.run_id, "manual__2026-11-30T10:00:00+00:00");
    assert_eq!((task.try_number, task.map_index), (2, -1));
    assert_eq!(event.owner, "7");
    assert_eq!(event.resource_version, "42");
    assert_eq!(event.creation_unix_ms, 1_796_032_800_000);
    assert_eq!(event.phase(), Phase::Pending);
    assert_eq!(event.deletion_unix_ms, None);
}

#[test]
fn unusable_pods_give_typed_errors() {
    #[rustfmt::skip]
    let cases: Vec<(&str, Value, ProjectionError)> = vec![
        ("no annotations", with(worker_pod(), "/metadata/annotations", Value::Null), ProjectionError::NoAnnotations),
        ("no dag_id", with(worker_pod(), "/metadata/annotations/dag_id", json!("")), ProjectionError::MissingAnnotation("dag_id")),
        ("try_number not an integer", with(worker_pod(), "/metadata/annotations/try_number", json!("2.0")),
            ProjectionError::NotAnInteger { annotation: "try_number", value: "2.0".into() }),
        ("map_index not an integer", with(worker_pod(), "/metadata/annotations/map_index", json!("x")),
            ProjectionError::NotAnInteger { annotation: "map_index", value: "x".into() }),
        ("no owner label", with(worker_pod(), "/metadata/labels", json!({"dag_id": "etl"})), ProjectionError::NoOwner),
        ("no uid", with(worker_pod(), "/metadata/uid", Value::Null), ProjectionError::NoUid),
        ("no run at all", with(worker_pod(), "/metadata/annotations/run_id", json!("")), ProjectionError::NoRun),
    ];
    for (case, pod, error) in cases {
        assert_eq!(project_json(pod), Err(error), "{case}");
    }
}

/// The executor's signature travels with the event, as written, for the processor to check;
/// both readers agree, and a pod without one carries an empty signature.
#[test]
fn the_signature_annotation_travels_as_written() {
    let mut signed = worker_pod();
    signed["metadata"]["annotations"]["podstream.io/signature"] = json!("v1:00ff");
    assert_eq!(project_json(signed.clone()).unwrap().signature, "v1:00ff");
    assert_eq!(project_json(worker_pod()).unwrap().signature, "");
    let event = json!({"type": "MODIFIED", "object": signed});
    let lean = project_watch_event(&event.to_string());
    assert_eq!(
        lean.clone().and_then(Result::ok).unwrap().signature,
        "v1:00ff"
    );
    assert_eq!(vec![lean], generic(event));
}

/// The TI's UUID annotation, as cncf.kubernetes 10.25 writes it: the key when valid, a dead
/// letter when not (never a fallback to the names), the names alone when absent; the lean
/// reader agrees on each.
#[test]
fn a_task_instance_id_is_the_identity_and_an_invalid_one_is_refused() {
    let id = |value: &str| {
        with(
            worker_pod(),
            "/metadata/annotations/task_instance_id",
            json!(value),
        )
    };
    #[rustfmt::skip]
    let cases: [(&str, Value, Result<&str, ProjectionError>); 5] = [
        ("valid", id("0196b3a0-1c2d-7e3f-8a4b-5c6d7e8f9a0b"), Ok("0196b3a0-1c2d-7e3f-8a4b-5c6d7e8f9a0b")),
        ("upper case, no hyphens", id("0196B3A01C2D7E3F8A4B5C6D7E8F9A0B"), Ok("0196b3a0-1c2d-7e3f-8a4b-5c6d7e8f9a0b")),
        ("absent", worker_pod(), Ok("")),
        ("not a uuid", id("ti-42"), Err(ProjectionError::InvalidTaskInstanceId("ti-42".into()))),
        ("empty", id(""), Err(ProjectionError::InvalidTaskInstanceId(String::new()))),
    ];
    for (case, pod, expected) in cases {
        let projected = project_json(pod.clone());
        match expected {
            Ok(want) => {
                let task = projected
                    .unwrap_or_else(|e| panic!("{case}: {e}"))
                    .task
                    .unwrap();
                assert_eq!(task.task_instance_id, want, "{case}");
                assert_eq!(
                    (task.dag_id.as_str(), task.try_number),
                    ("etl", 2),
                    "{case}"
                );
            }
            Err(error) => assert_eq!(projected, Err(error), "{case}"),
        }
        let event = json!({"type": "MODIFIED", "object": pod});
        assert_eq!(
            vec![project_watch_event(&event.to_string())],
            generic(event),
            "{case}: lean reader"
        );
    }
}

#[test]
fn old_pods_with_a_logical_date_keep_an_incomplete_key() {
    let pod = with(
        worker_pod(),
        "/metadata/annotations",
        json!({
        "dag_id": "etl", "task_id": "load", "try_number": "1", "execution_date": "2022-07-12T16:00:00+00:00"}),
    );
    let task = project_json(pod).unwrap().task.unwrap();
    assert!(!task.is_complete());
    assert_eq!(task.logical_date, "2022-07-12T16:00:00+00:00");
}

#[test]
fn only_init_containers_and_the_first_app_container_are_read() {
    // kubelet sorts statuses by name: "base" < "sidecar", but put them the other way round.
    let sidecar_waiting = with(
        worker_pod(),
        "/status/containerStatuses",
        json!([waiting("sidecar", "ErrImagePull"), {"name": "base", "image": "x", "imageID": "", "ready": false, "restartCount": 0}]),
    );
    let event = project_json(sidecar_waiting).unwrap();
    assert_eq!(
        event.first_app_waiting, None,
        "the second app container is not read"
    );

    let base_waiting = with(
        worker_pod(),
        "/status/containerStatuses",
        json!([
            waiting("sidecar", "ContainerCreating"),
            waiting("base", "InvalidImageName")
        ]),
    );
    assert_eq!(
        project_json(base_waiting)
            .unwrap()
            .first_app_waiting
            .unwrap()
            .reason,
        "InvalidImageName"
    );

    let init_waiting = with(
        worker_pod(),
        "/status/initContainerStatuses",
        json!([waiting("init", "CreateContainerConfigError")]),
    );
    assert_eq!(
        project_json(init_waiting).unwrap().init_waiting[0].reason,
        "CreateContainerConfigError"
    );
}

#[test]
fn labels_and_deletion_are_projected() {
    let mut pod = with(
        worker_pod(),
        "/metadata/deletionTimestamp",
        json!("2026-11-30T10:00:30Z"),
    );
    pod["metadata"]["labels"]["airflow_executor_done"] = json!("True");
    pod["metadata"]["labels"]["airflow_pod_revoked"] = json!("True");
    pod["status"] = json!({"phase": "Failed", "reason": "ProviderFailed", "containerStatuses": [
        {"name": "base", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
         "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]});
    let event = project_json(pod).unwrap();
    assert!(event.executor_done && event.revoked);
    assert_eq!(event.deletion_unix_ms, Some(1_796_032_830_000));
    assert_eq!(event.status_reason, "ProviderFailed");
    assert_eq!(
        (
            event.terminated[0].exit_code,
            event.terminated[0].reason.as_str()
        ),
        (137, "OOMKilled")
    );
}

#[test]
fn watch_json_shapes() {
    let event = |t: &str| json!({"type": t, "object": worker_pod()});
    assert!(matches!(
        &read_value(event("DELETED"))[..],
        [WatchItem::Pod {
            event_type: EventType::Deleted,
            ..
        }]
    ));
    assert!(matches!(
        &read_value(worker_pod())[..],
        [WatchItem::Pod {
            event_type: EventType::Added,
            ..
        }]
    ));
    let list = json!({"kind": "PodList", "items": [worker_pod(), worker_pod()]});
    assert_eq!(read_value(list).len(), 2);
    let bookmark = json!({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}});
    assert_eq!(
        read_value(bookmark),
        [WatchItem::Bookmark {
            resource_version: "9".into()
        }]
    );
    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}});
    assert_eq!(
        read_value(gone),
        [WatchItem::WatchError {
            message: "too old resource version".into()
        }]
    );
    for bad in [
        json!(1),
        json!({"kind": "Secret"}),
        json!({"type": "WHAT", "object": {}}),
        json!({"kind": "List"}),
    ] {
        assert!(
            matches!(&read_value(bad.clone())[..], [WatchItem::Invalid { .. }]),
            "{bad}"
        );
    }
}

#[test]
fn typed_fast_path_agrees_with_the_generic_reader() {
    let shapes = [
        json!({"type": "ADDED", "object": worker_pod()}),
        json!({"type": "MODIFIED", "object": with(worker_pod(), "/kind", Value::Null)}),
        json!({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}}),
        json!({"type": "ADDED", "object": {"kind": "ConfigMap", "metadata": {"name": "cm"}}}),
        json!({"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": 42}}}),
        json!({"kind": "PodList", "items": [worker_pod()]}),
        worker_pod(),
        json!([1, 2]),
    ];
    for shape in shapes {
        assert_eq!(
            read_json(&shape.to_string()),
            read_value(shape.clone()),
            "{shape}"
        );
    }
    assert!(matches!(
        &read_json("{oops")[..],
        [WatchItem::Invalid { .. }]
    ));
}

/// What the generic path (`read_value`, k8s-openapi's `Pod`, `project`) makes of one value.
fn generic(value: Value) -> Vec<Option<Projected>> {
    projected(read_value(value))
}

/// Each item's projection, `None` for what is not a pod.
fn projected(items: Vec<WatchItem>) -> Vec<Option<Projected>> {
    items
        .into_iter()
        .map(|item| match item {
            WatchItem::Pod { event_type, pod } => {
                Some(project(event_type, &pod).map_err(|err| (err, pod_ref(&pod))))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn lean_reader_agrees_with_the_generic_path_on_real_shaped_pods() {
    let running = with(
        with(worker_pod(), "/status/phase", json!("Running")),
        "/status/containerStatuses",
        json!([
            waiting("sidecar", "ErrImagePull"),
            waiting("base", "CreateContainerConfigError")
        ]),
    );
    let failed = with(
        with(worker_pod(), "/status/phase", json!("Failed")),
        "/status/initContainerStatuses",
        json!([{"name": "init", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]),
    );
    let deleting = with(
        with(
            worker_pod(),
            "/metadata/deletionTimestamp",
            json!("2026-11-30T10:05:00Z"),
        ),
        "/metadata/labels/airflow_executor_done",
        json!("True"),
    );
    let escaped = with(
        worker_pod(),
        "/metadata/annotations/task_id",
        json!("tâche \"q\""),
    );
    let no_key = with(
        worker_pod(),
        "/metadata/annotations",
        json!({"dag_id": "etl"}),
    );
    for (kind, pod) in [
        ("ADDED", worker_pod()),
        ("MODIFIED", running),
        ("MODIFIED", failed),
        ("DELETED", deleting),
        ("MODIFIED", escaped),
        ("MODIFIED", no_key),
    ] {
        let event = json!({"type": kind, "object": pod});
        let lean = project_watch_event(&event.to_string());
        assert!(lean.is_some(), "the lean reader takes {event}");
        assert_eq!(vec![lean], generic(event.clone()), "{event}");
    }
    // Not pod watch events: left to the generic path.
    for other in [
        json!({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}}),
        json!({"type": "ADDED", "object": {"kind": "ConfigMap", "metadata": {"name": "cm"}}}),
        json!({"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": 42}}}),
        json!({"type": "ADDED", "object": with(worker_pod(), "/metadata/labels/airflow-worker", Value::Null)}),
        worker_pod(),
        json!({"kind": "PodList", "items": [worker_pod()]}),
    ] {
        assert_eq!(project_watch_event(&other.to_string()), None, "{other}");
    }
}

/// Exit codes as raw JSON numbers: the lean reader takes what serde reads as an `i32` and
/// leaves the rest (`-0` and anything with a fraction or an exponent are floats to serde, or
/// out of range) to the generic path.
#[test]
fn lean_reader_reads_exit_codes_as_serde_does() {
    let failed = with(
        with(worker_pod(), "/status/phase", json!("Failed")),
        "/status/containerStatuses",
        json!([{"name": "base", "state": {"terminated": {"exitCode": 4242, "reason": "Error"}}}]),
    );
    let template = json!({"type": "MODIFIED", "object": failed}).to_string();
    for (code, taken) in [
        ("137", true),
        ("-1", true),
        ("-2147483648", true),
        ("null", true),
        ("-0", false),
        ("1.0", false),
        ("1e2", false),
        ("2147483648", false),
    ] {
        let text = template.replace("4242", code);
        let lean = project_watch_event(&text);
        assert_eq!(lean.is_some(), taken, "exit code {code}");
        if let Some(lean) = lean {
            assert_eq!(
                vec![Some(lean)],
                projected(read_json(&text)),
                "exit code {code}"
            );
        }
    }
}

/// Arbitrary JSON, shaped or not like a pod.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[a-zA-Z0-9 _.-]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("Pending"),
            Just("Running"),
            Just("Failed"),
            Just("ProviderFailed"),
            Just("True"),
            Just("1")
        ]
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let key = prop_oneof![
            Just("metadata"),
            Just("labels"),
            Just("annotations"),
            Just("status"),
            Just("phase"),
            Just("uid"),
            Just("airflow-worker"),
            Just("dag_id"),
            Just("task_id"),
            Just("try_number"),
            Just("run_id"),
            Just("containerStatuses"),
            Just("state"),
            Just("waiting"),
            Just("reason"),
            Just("kind"),
            Just("type"),
            Just("object"),
            Just("items"),
            Just("deletionTimestamp"),
            Just("name")
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key.prop_map(str::to_owned), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A pod read as the ingest's watch reads it, taken as a `MODIFIED` event: the event, or
/// the dead letter's reason and raw JSON.
fn watched(text: &str) -> Result<podstream_proto::PodEvent, (String, String)> {
    let pod: WatchedPod =
        serde_json::from_str(text).expect("any JSON object reads as a watched pod");
    pod.into_event(EventType::Modified)
        .map_err(|unusable| (unusable.reason, unusable.raw.get().to_owned()))
}

/// What k8s-openapi's `Pod` makes of the same text, when it takes it.
fn full(text: &str) -> Option<Result<podstream_proto::PodEvent, String>> {
    let pod: Pod = serde_json::from_str(text).ok()?;
    Some(project(EventType::Modified, &pod).map_err(|e| e.to_string()))
}

#[test]
fn the_watched_pod_projects_as_the_full_pod_and_keeps_an_unusable_one_whole() {
    let base_second = with(
        with(
            worker_pod(),
            "/spec/containers",
            json!([{"name": "base", "image": "apache/airflow"}, {"name": "a-sidecar"}]),
        ),
        "/status/containerStatuses",
        json!([
            waiting("a-sidecar", "ErrImagePull"),
            waiting("base", "CreateContainerConfigError")
        ]),
    );
    let escaped_name = with(
        worker_pod(),
        "/spec/containers",
        json!([{"name": "b\\ase \"x\""}]),
    );
    let no_containers = with(worker_pod(), "/spec/containers", Value::Null);
    let no_spec = with(worker_pod(), "/spec", Value::Null);
    let no_owner = with(worker_pod(), "/metadata/labels", json!({}));
    let bad_try = with(
        worker_pod(),
        "/metadata/annotations/try_number",
        json!("two"),
    );
    for pod in [
        worker_pod(),
        base_second.clone(),
        escaped_name,
        no_containers,
        no_spec,
        no_owner,
        bad_try,
    ] {
        let text = pod.to_string();
        let expected = full(&text).expect("a pod k8s-openapi reads");
        match (watched(&text), expected) {
            (Ok(event), Ok(want)) => assert_eq!(event, want, "{pod}"),
            (Err((reason, raw)), Err(want)) => {
                assert_eq!(reason, want, "{pod}");
                assert_eq!(
                    raw, text,
                    "the dead letter carries the pod exactly as received"
                );
            }
            (got, want) => panic!("{pod}: watched {got:?}, full {want:?}"),
        }
    }
    // The spec's first container decides which status is the base's (statuses are sorted
    // by name): the base's waiting reason, not the sidecar's.
    let event = watched(&base_second.to_string()).unwrap();
    assert_eq!(
        event.first_app_waiting.unwrap().reason,
        "CreateContainerConfigError"
    );
}

/// A pod k8s-openapi refuses (a name that is a number) becomes that pod's dead letter; the
/// rest of its list reads (a typed list failed whole, and the watcher retried it forever).
#[test]
fn a_malformed_pod_in_a_list_is_one_dead_letter_not_a_failed_list() {
    let broken = with(worker_pod(), "/metadata/name", json!(42));
    assert!(
        full(&broken.to_string()).is_none(),
        "k8s-openapi refuses it"
    );
    let list = json!([
        worker_pod(),
        broken,
        with(worker_pod(), "/metadata/uid", json!("u-2"))
    ]);
    let pods: Vec<WatchedPod> = serde_json::from_str(&list.to_string()).unwrap();
    let read: Vec<_> = pods
        .into_iter()
        .map(|p| p.into_event(EventType::Added))
        .collect();
    assert!(read[0].is_ok() && read[2].is_ok(), "{read:?}");
    let unusable = read[1].as_ref().unwrap_err();
    assert!(
        unusable.reason.contains("not a readable pod"),
        "{}",
        unusable.reason
    );
    assert!(unusable.raw.get().contains("42"));
}

/// `value` as JSON text with `spaces` between its tokens: each gap takes the next entry of
/// `spaces` in turn (JSON's whitespace: space, tab, CR, LF), so one value can hold every form.
fn spaced(value: &Value, spaces: &[String]) -> String {
    fn gap(gaps: &mut impl Iterator<Item = String>, out: &mut String) {
        out.push_str(&gaps.next().unwrap_or_default());
    }
    fn write(value: &Value, gaps: &mut impl Iterator<Item = String>, out: &mut String) {
        match value {
            Value::Object(map) => {
                out.push('{');
                for (i, (key, item)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    gap(gaps, out);
                    out.push_str(&Value::String(key.clone()).to_string());
                    gap(gaps, out);
                    out.push(':');
                    gap(gaps, out);
                    write(item, gaps, out);
                    gap(gaps, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    gap(gaps, out);
                    write(item, gaps, out);
                    gap(gaps, out);
                }
                out.push(']');
            }
            leaf => out.push_str(&leaf.to_string()),
        }
    }
    let mut gaps = spaces.iter().cloned().cycle();
    let mut out = String::new();
    write(value, &mut gaps, &mut out);
    out
}

/// Compact (as the apiserver sends), spaced, pretty-printed, and with every kind of JSON
/// whitespace between tokens (Python's and kubectl's own forms run end to end in decide_cli).
#[test]
fn the_lean_reader_takes_every_json_form_and_agrees_with_the_generic_path() {
    let running = with(worker_pod(), "/status/phase", json!("Running"));
    for (kind, pod) in [("ADDED", worker_pod()), ("MODIFIED", running)] {
        let event = json!({"type": kind, "object": pod});
        let forms = [
            event.to_string(),
            spaced(&event, &[String::new(), " ".into()]),
            serde_json::to_string_pretty(&event).unwrap(),
            spaced(&event, &["\r\n\t ".into()]),
            // Runs longer than a word of spaces, ending in and mixed with other whitespace.
            spaced(
                &event,
                &[
                    " ".repeat(8),
                    format!("\n{}", " ".repeat(17)),
                    "\t        \r".into(),
                ],
            ),
        ];
        for text in forms {
            let lean = project_watch_event(&text);
            assert!(lean.is_some(), "the lean reader declined {text}");
            assert_eq!(vec![lean], generic(event.clone()), "{text}");
        }
    }
}

fn whitespace() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop::collection::vec(
            prop_oneof![Just(' '), Just('\t'), Just('\n'), Just('\r')],
            0..3,
        )
        .prop_map(|chars| chars.into_iter().collect::<String>()),
        1..16,
    )
}

proptest! {
    /// Random whitespace between any two tokens changes nothing: the lean reader takes the
    /// pod (no decline) and projects what the generic path projects.
    #[test]
    fn whitespace_anywhere_between_tokens_keeps_the_fast_path(
        spaces in whitespace(),
        kind in prop_oneof![Just("ADDED"), Just("MODIFIED"), Just("DELETED")],
        phase in prop_oneof![Just("Pending"), Just("Running"), Just("Failed"), Just("Succeeded")]) {
        let pod = with(worker_pod(), "/status/phase", json!(phase));
        let event = json!({"type": kind, "object": pod});
        let text = spaced(&event, &spaces);
        let lean = project_watch_event(&text);
        prop_assert!(lean.is_some(), "declined: {:?}", text);
        prop_assert_eq!(vec![lean], generic(event));
    }

    /// Wherever k8s-openapi takes a mutated worker pod, the ingest's watch type projects it
    /// alike, or dead-letters it for the same reason with the pod as received.
    #[test]
    fn the_watched_pod_agrees_on_mutated_worker_pods(pointer in prop_oneof![
            Just("/spec"), Just("/spec/containers"), Just("/spec/containers/0"),
            Just("/spec/containers/0/name"), Just("/status"), Just("/metadata/labels"),
            Just("/metadata/annotations/try_number"), Just("/metadata/uid"), Just("/status/phase")],
        replacement in json_value()) {
        let mut pod = worker_pod();
        if let Some(slot) = pod.pointer_mut(pointer) { *slot = replacement; }
        let text = pod.to_string();
        let got = watched(&text);
        if let Some(want) = full(&text) {
            prop_assert_eq!(got.map_err(|(reason, raw)| { assert_eq!(raw, text.clone()); reason }), want);
        }
    }

    #[test]
    fn nothing_panics_the_reader_or_the_projection(value in json_value()) {
        prop_assert_eq!(read_json(&value.to_string()), read_value(value.clone()));
        for item in read_value(value) {
            if let WatchItem::Pod { event_type, pod } = item {
                let _ = project(event_type, &pod);
            }
        }
    }

    /// Wherever the lean reader takes a mutated worker pod, it projects what the
    /// generic path projects (the mutations touch only fields both read).
    #[test]
    fn lean_reader_agrees_on_mutated_worker_pods(pointer in prop_oneof![
            Just("/metadata/annotations/try_number"), Just("/metadata/labels/airflow-worker"),
            Just("/metadata/annotations"), Just("/metadata/labels"), Just("/status"),
            Just("/metadata/creationTimestamp"), Just("/metadata/uid"), Just("/spec")],
        replacement in json_value(),
        kind in prop_oneof![Just("ADDED"), Just("MODIFIED"), Just("DELETED")]) {
        let mut pod = worker_pod();
        if let Some(slot) = pod.pointer_mut(pointer) { *slot = replacement; }
        let event = json!({"type": kind, "object": pod});
        if let Some(lean) = project_watch_event(&event.to_string()) {
            prop_assert_eq!(vec![Some(lean)], generic(event));
        }
    }

    #[test]
    fn mutated_worker_pods_project_or_fail_cleanly(pointer in prop_oneof![
            Just("/metadata/annotations/try_number"), Just("/metadata/labels/airflow-worker"),
            Just("/metadata/annotations"), Just("/status"), Just("/metadata/creationTimestamp")],
        replacement in json_value()) {
        let mut pod = worker_pod();
        if let Some(slot) = pod.pointer_mut(pointer) { *slot = replacement; }
        for item in read_value(pod) {
            if let WatchItem::Pod { event_type, pod } = item {
                let _ = project(event_type, &pod);
            }
        }
    }
}

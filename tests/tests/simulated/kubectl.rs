//! Stock kubectl against the simulator: create, apply, label, annotate, patch, delete, and
//! watches that see what a real apiserver would send.

use std::path::PathBuf;

use podstream_sim::WorkerPod;
use podstream_tests::{KubectlWatch, Sim, kubectl, kubectl_has_subresource_flag, sim};
use serde_json::Value;

fn run(sim: &Sim, args: &[&str]) -> String {
    let (ok, stdout, stderr) = kubectl(&sim.kubeconfig, args);
    assert!(ok, "kubectl {args:?} failed: {stderr}");
    stdout
}

fn event(watch: &KubectlWatch) -> (String, Value) {
    let value = watch.next().expect("kubectl printed no event");
    (
        value["type"].as_str().unwrap_or_default().to_owned(),
        value["object"].clone(),
    )
}

fn write_pod(dir: &std::path::Path, pod: &Value) -> PathBuf {
    let path = dir.join(format!(
        "{}.json",
        pod["metadata"]["name"].as_str().unwrap()
    ));
    std::fs::write(&path, pod.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_the_selector_exit_and_graceful_delete_of_a_real_apiserver() {
    let sim = sim(false).await;
    let dir = tempfile::tempdir().unwrap();
    let mut pod = WorkerPod::new("task-p", "1", "etl", "extract", "manual__1").to_json();
    pod["status"] = Value::Null;
    let file = write_pod(dir.path(), &pod);
    let file = file.to_str().unwrap();
    assert!(run(&sim, &["create", "-f", file]).contains("pod/task-p created"));
    // apply on top of create: the last-applied annotation is added, an edit goes through.
    run(&sim, &["apply", "-f", file]);
    pod["metadata"]["annotations"]["note"] = "applied".into();
    write_pod(dir.path(), &pod);
    run(&sim, &["apply", "-f", file]);
    let note = run(
        &sim,
        &[
            "get",
            "pod",
            "task-p",
            "-n",
            "airflow",
            "-o",
            "jsonpath={.metadata.annotations.note}",
        ],
    );
    assert_eq!(note, "applied");

    let scoped = KubectlWatch::start(
        &sim.kubeconfig,
        &[
            "get",
            "pods",
            "-n",
            "airflow",
            "-l",
            "airflow-worker=1",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
        ],
    );
    let unscoped = KubectlWatch::start(
        &sim.kubeconfig,
        &[
            "get",
            "pods",
            "-n",
            "airflow",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
        ],
    );
    assert_eq!(event(&scoped).0, "ADDED");
    assert_eq!(event(&unscoped).0, "ADDED");

    assert!(
        run(
            &sim,
            &[
                "label",
                "pod",
                "task-p",
                "-n",
                "airflow",
                "airflow-worker=2",
                "--overwrite"
            ]
        )
        .contains("labeled")
    );
    let (kind, object) = event(&scoped);
    assert_eq!(
        kind, "DELETED",
        "the label-scoped watch sees the relabel as a deletion"
    );
    assert_eq!(object["metadata"]["labels"]["airflow-worker"], "2");
    assert!(object["metadata"]["deletionTimestamp"].is_null());
    let (kind, object) = event(&unscoped);
    assert_eq!(kind, "MODIFIED");
    assert_eq!(object["metadata"]["labels"]["airflow-worker"], "2");

    run(
        &sim,
        &["annotate", "pod", "task-p", "-n", "airflow", "seen=yes"],
    );
    assert_eq!(event(&unscoped).0, "MODIFIED");

    // The main resource ignores status: "patched (no change)", no event.
    let ignored = run(
        &sim,
        &[
            "patch",
            "pod",
            "task-p",
            "-n",
            "airflow",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running"}}"#,
        ],
    );
    assert!(ignored.contains("no change"), "{ignored}");
    if kubectl_has_subresource_flag() {
        run(
            &sim,
            &[
                "patch",
                "pod",
                "task-p",
                "-n",
                "airflow",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Running"}}"#,
            ],
        );
    } else {
        // kubectl < 1.24 (Debian bookworm ships 1.20) has no --subresource: the kubelet's
        // status write goes through the control API instead.
        eprintln!("kubectl has no --subresource flag; setting the status through the control API");
        sim.server
            .cluster()
            .set_phase("airflow", "task-p", "Running")
            .unwrap();
    }
    let (kind, object) = event(&unscoped);
    assert_eq!(
        (kind.as_str(), object["status"]["phase"].as_str()),
        ("MODIFIED", Some("Running"))
    );
    let phase = run(
        &sim,
        &[
            "get",
            "pod",
            "task-p",
            "-n",
            "airflow",
            "-o",
            "jsonpath={.status.phase}",
        ],
    );
    assert_eq!(phase, "Running");

    assert!(
        run(
            &sim,
            &[
                "delete",
                "pod",
                "task-p",
                "-n",
                "airflow",
                "--grace-period=1"
            ]
        )
        .contains("deleted")
    );
    let (kind, object) = event(&unscoped);
    assert_eq!(kind, "MODIFIED");
    assert!(object["metadata"]["deletionTimestamp"].is_string());
    let (kind, object) = event(&unscoped);
    assert_eq!(kind, "DELETED");
    assert_eq!(object["metadata"]["name"], "task-p");
    let (ok, _, stderr) = kubectl(&sim.kubeconfig, &["get", "pod", "task-p", "-n", "airflow"]);
    assert!(!ok && stderr.contains("NotFound"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_field_selectors_and_tables() {
    let sim = sim(false).await;
    let cluster = sim.server.cluster();
    for (name, phase) in [
        ("ok-1", "Succeeded"),
        ("bad-1", "Failed"),
        ("bad-2", "Failed"),
        ("run-1", "Running"),
    ] {
        cluster
            .create_pod(WorkerPod::new(name, "1", "etl", name, "manual__1").to_json())
            .unwrap();
        cluster.set_phase("airflow", name, phase).unwrap();
    }
    let failed = run(
        &sim,
        &[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "status.phase=Failed",
            "-o",
            "name",
        ],
    );
    assert_eq!(
        failed.lines().collect::<Vec<_>>(),
        ["pod/bad-1", "pod/bad-2"]
    );
    let not_failed = run(
        &sim,
        &[
            "get",
            "pods",
            "-n",
            "airflow",
            "--field-selector",
            "status.phase!=Failed",
            "-o",
            "name",
        ],
    );
    assert_eq!(
        not_failed.lines().collect::<Vec<_>>(),
        ["pod/ok-1", "pod/run-1"]
    );
    // The default table output, as a person would type it.
    let table = run(
        &sim,
        &["get", "pods", "-n", "airflow", "-l", "airflow-worker=1"],
    );
    let header = table.lines().next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains("STATUS"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("bad-1") && l.contains("Failed")),
        "{table}"
    );
    let namespaces = run(&sim, &["get", "ns"]);
    assert!(
        namespaces.contains("airflow") && namespaces.contains("kube-system"),
        "{namespaces}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_and_deletes_a_namespace_with_its_protobuf_client() {
    let sim = sim(false).await;
    // kubectl's typed client sends this body as protobuf, not JSON.
    let created = run(&sim, &["create", "namespace", "team-a"]);
    assert!(created.contains("namespace/team-a created"), "{created}");
    let labelled = run(&sim, &["label", "namespace", "team-a", "team=a"]);
    assert!(labelled.contains("labeled"), "{labelled}");
    let label = run(
        &sim,
        &[
            "get",
            "namespace",
            "team-a",
            "-o",
            "jsonpath={.metadata.labels.team}",
        ],
    );
    assert_eq!(label, "a");
    // A pod can live there, and goes with it.
    let mut pod = WorkerPod::new("task-t", "1", "etl", "extract", "manual__1").to_json();
    pod["metadata"]["namespace"] = "team-a".into();
    sim.server.cluster().create_pod(pod).unwrap();
    let (ok, _, stderr) = kubectl(&sim.kubeconfig, &["create", "namespace", "team-a"]);
    assert!(!ok && stderr.contains("AlreadyExists"), "{stderr}");
    run(&sim, &["delete", "namespace", "team-a"]);
    let (ok, _, stderr) = kubectl(&sim.kubeconfig, &["get", "pod", "task-t", "-n", "team-a"]);
    assert!(!ok && stderr.contains("NotFound"), "{stderr}");
}

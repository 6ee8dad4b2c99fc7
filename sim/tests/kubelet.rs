//! The simulator's kubelet, driven through the API as a scheduler would: pods created with
//! the kube client run as local processes and end with the status a kubelet writes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use podstream_sim::SimConfig;
use podstream_sim::{Fault, Kubelet, KubeletConfig, Server};
use serde_json::{Value, json};
use support::{client, server, server_with};

struct Node {
    sim: Server,
    kubelet: Kubelet,
    pods: Api<Pod>,
    _dir: tempfile::TempDir,
}

async fn node(max_pods: Option<usize>) -> Node {
    node_with(max_pods, server().await).await
}

async fn node_with(max_pods: Option<usize>, sim: Server) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(
        sim.cluster().clone(),
        KubeletConfig {
            root: dir.path().to_path_buf(),
            max_pods,
            passed_env: Vec::new(),
        },
    )
    .unwrap();
    let pods = Api::namespaced(client(&sim).await, "airflow");
    Node {
        sim,
        kubelet,
        pods,
        _dir: dir,
    }
}

fn pod(name: &str, container: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "airflow-worker": "1" } },
        "spec": { "restartPolicy": "Never", "containers": [container] },
    }))
    .unwrap()
}

fn shell(script: &str) -> Value {
    json!({ "name": "base", "image": "none", "command": ["sh", "-c", script],
            "env": [{ "name": "POD", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }] })
}

async fn create(node: &Node, pod: Pod) {
    node.pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Polls the pod until `done` holds (or it is gone, as `Value::Null`), for up to 20 s.
async fn until(node: &Node, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let pod = node
            .sim
            .cluster()
            .pod("airflow", name)
            .unwrap_or(Value::Null);
        if done(&pod) {
            return pod;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "pod {name} never reached the state; now {}",
        node.sim
            .cluster()
            .pod("airflow", name)
            .unwrap_or(Value::Null)
    );
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

fn container_state(pod: &Value) -> &Value {
    &pod["status"]["containerStatuses"][0]["state"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_and_end_by_their_exit_code_with_logs() {
    let node = node(None).await;
    create(&node, pod("ok", shell("echo hello from $POD; sleep 0.3"))).await;
    create(&node, pod("bad", shell("echo failing >&2; exit 3"))).await;

    let running = until(&node, "ok", |p| phase(p) == "Running").await;
    assert_eq!(running["spec"]["nodeName"], "podstream-sim-node");
    assert_eq!(running["status"]["podIP"], "127.0.0.1");
    assert!(container_state(&running)["running"]["startedAt"].is_string());

    let ok = until(&node, "ok", |p| phase(p) == "Succeeded").await;
    let terminated = &container_state(&ok)["terminated"];
    assert_eq!(terminated["exitCode"], 0);
    assert_eq!(terminated["reason"], "Completed");
    let bad = until(&node, "bad", |p| phase(p) == "Failed").await;
    let terminated = &container_state(&bad)["terminated"];
    assert_eq!(terminated["exitCode"], 3);
    assert_eq!(terminated["reason"], "Error");

    let log = node.pods.logs("ok", &LogParams::default()).await.unwrap();
    assert_eq!(log, "hello from ok\n");
    let log = node.pods.logs("bad", &LogParams::default()).await.unwrap();
    assert_eq!(log, "failing\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_delete_terms_the_process_and_the_pod_goes_with_it() {
    let node = node(None).await;
    // Traps TERM and exits: the pod must go long before its 60 s grace period.
    let mut polite = pod(
        "polite",
        shell("trap 'echo got TERM; exit 0' TERM; while true; do sleep 0.05; done"),
    );
    polite
        .spec
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(60);
    create(&node, polite).await;
    // Ignores TERM: SIGKILL when its 1 s grace period ends.
    let mut stubborn = pod(
        "stubborn",
        shell("trap '' TERM; while true; do sleep 0.05; done"),
    );
    stubborn
        .spec
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(1);
    create(&node, stubborn).await;
    until(&node, "polite", |p| phase(p) == "Running").await;
    until(&node, "stubborn", |p| phase(p) == "Running").await;

    let terminating = node
        .pods
        .delete("polite", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = terminating
        .left()
        .expect("a graceful delete returns the pod");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    node.pods
        .delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    until(&node, "polite", Value::is_null).await;
    until(&node, "stubborn", Value::is_null).await;
    for _ in 0..100 {
        if node.kubelet.active() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(node.kubelet.active(), 0, "a pod's task outlived its pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_containers_end_as_a_kubelet_reports_them() {
    let node = node(None).await;
    create(
        &node,
        pod("no-command", json!({ "name": "base", "image": "x" })),
    )
    .await;
    create(
        &node,
        pod(
            "no-such-program",
            json!({ "name": "base", "image": "x", "command": ["/no/such/program"] }),
        ),
    )
    .await;
    create(
        &node,
        pod(
            "missing-secret",
            json!({ "name": "base", "image": "x", "command": ["true"],
                    "env": [{ "name": "S", "valueFrom": { "secretKeyRef": { "name": "db", "key": "password" } } }] }),
        ),
    )
    .await;
    for name in ["no-command", "no-such-program"] {
        let pod = until(&node, name, |p| phase(p) == "Failed").await;
        let terminated = &container_state(&pod)["terminated"];
        assert_eq!(terminated["reason"], "ContainerCannotRun", "{name}");
        assert_eq!(terminated["exitCode"], 128, "{name}");
        assert!(terminated["message"].is_string(), "{name}");
    }
    let pod = until(&node, "missing-secret", |p| {
        !container_state(p)["waiting"]["reason"].is_null()
            && container_state(p)["waiting"]["reason"] != "ContainerCreating"
    })
    .await;
    assert_eq!(phase(&pod), "Pending");
    assert_eq!(
        container_state(&pod)["waiting"]["reason"],
        "CreateContainerConfigError"
    );
    // The simulator is still serving, and a Pending pod that never started goes at once.
    node.pods
        .delete("missing-secret", &DeleteParams::default())
        .await
        .unwrap();
    until(&node, "missing-secret", Value::is_null).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_play_as_a_node_reports_them() {
    let node = node(None).await;
    let long = || shell("while true; do sleep 0.05; done");
    for (name, fault) in [
        ("pull", "image-pull"),
        ("oom", "oom"),
        ("evicted", "evicted"),
        ("lost", "node-lost"),
    ] {
        let mut pod = pod(name, long());
        pod.metadata.annotations = Some(
            [
                ("podstream/kubelet-fault".to_owned(), fault.to_owned()),
                (
                    "podstream/kubelet-fault-after-seconds".to_owned(),
                    "0.3".to_owned(),
                ),
            ]
            .into(),
        );
        create(&node, pod).await;
    }
    let pull = until(&node, "pull", |p| {
        container_state(p)["waiting"]["reason"] == "ImagePullBackOff"
    })
    .await;
    assert_eq!(phase(&pull), "Pending");
    let oom = until(&node, "oom", |p| phase(p) == "Failed").await;
    assert_eq!(container_state(&oom)["terminated"]["reason"], "OOMKilled");
    assert_eq!(container_state(&oom)["terminated"]["exitCode"], 137);
    let evicted = until(&node, "evicted", |p| phase(p) == "Failed").await;
    assert_eq!(evicted["status"]["reason"], "Evicted");
    until(&node, "lost", Value::is_null).await;

    // Through the control API, on a pod that runs normally.
    create(&node, pod("later", long())).await;
    until(&node, "later", |p| phase(p) == "Running").await;
    node.kubelet
        .inject("airflow", "later", Fault::OomKilled)
        .unwrap();
    let later = until(&node, "later", |p| phase(p) == "Failed").await;
    assert_eq!(container_state(&later)["terminated"]["reason"], "OOMKilled");
    assert!(
        node.kubelet
            .inject("airflow", "nobody", Fault::Evicted)
            .is_err()
    );
}

/// A kill ends the whole container, as a cgroup would: also a process that made a session of
/// its own (Airflow 2's task runner calls `setsid`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_ends_processes_that_left_the_process_group() {
    let node = node(None).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("escaped.pid");
    // `$$$$`: the kubelet reads `$$` as an escaped `$`, as Kubernetes does.
    let script = format!(
        "setsid sh -c 'echo $$$$ > {}; exec sleep 300' & while true; do sleep 0.05; done",
        pidfile.display()
    );
    create(&node, pod("escapes", shell(&script))).await;
    until(&node, "escapes", |p| phase(p) == "Running").await;
    let started = std::time::Instant::now();
    let escaped: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            break pid;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let log = node.pods.logs("escapes", &LogParams::default()).await;
            panic!("no pid written: {log:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A zombie waits for a parent to reap it; it runs no more.
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rfind(')')
                .and_then(|at| stat.get(at + 1..))
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
    };
    assert!(alive(escaped));
    node.kubelet
        .inject("airflow", "escapes", Fault::OomKilled)
        .unwrap();
    until(&node, "escapes", |p| phase(p) == "Failed").await;
    let started = std::time::Instant::now();
    while alive(escaped) && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !alive(escaped),
        "the process in its own session was killed too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_leaves_pods_pending_until_room_frees() {
    let node = node(Some(1)).await;
    create(
        &node,
        pod("first", shell("while true; do sleep 0.05; done")),
    )
    .await;
    until(&node, "first", |p| phase(p) == "Running").await;
    create(&node, pod("second", shell("sleep 0.2"))).await;
    let waiting = until(&node, "second", |p| {
        p["status"]["conditions"][0]["reason"] == "Unschedulable"
    })
    .await;
    assert_eq!(phase(&waiting), "Pending");
    assert!(waiting["spec"]["nodeName"].is_null());
    node.pods
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    let second = until(&node, "second", |p| phase(p) == "Succeeded").await;
    assert_eq!(second["spec"]["nodeName"], "podstream-sim-node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_behind_the_retained_history_still_runs_every_pod() {
    // Two changes of history: the kubelet's own status writes push it past its place, so it
    // reads 410 and must start again from the pods as they are.
    let sim = server_with(SimConfig {
        retain_events: 2,
        namespaces: vec!["airflow".into()],
        ..SimConfig::default()
    })
    .await;
    let node = node_with(None, sim).await;
    let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    for name in &names {
        create(&node, pod(name, shell("exit 0"))).await;
    }
    for name in &names {
        until(&node, name, |p| phase(p) == "Succeeded").await;
    }
}

/// The kubelet's directory holds the pods' programs and logs: made for this user alone, and
/// one that others may write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_directory_is_this_users_alone() {
    use std::os::unix::fs::PermissionsExt as _;
    let sim = server().await;
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh/kubelet");
    let kubelet = Kubelet::start(
        sim.cluster().clone(),
        KubeletConfig {
            root: fresh.clone(),
            max_pods: None,
            passed_env: Vec::new(),
        },
    )
    .unwrap();
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    drop(kubelet);

    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let Err(refused) = Kubelet::start(
        sim.cluster().clone(),
        KubeletConfig {
            root: open.clone(),
            max_pods: None,
            passed_env: Vec::new(),
        },
    ) else {
        panic!("a directory others may write is refused");
    };
    assert!(
        refused.to_string().contains("writable by no one else"),
        "{refused}"
    );
}

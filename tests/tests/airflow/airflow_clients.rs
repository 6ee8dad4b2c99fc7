//! Airflow's own Kubernetes clients against the simulator and its kubelet: the official
//! Python client (list, `Watch().stream` with `watch=True`, create, patch, delete) and the
//! cncf.kubernetes provider's `KubernetesJobWatcher`, from each Airflow venv that
//! `scripts/setup.sh` installs (tests/airflow/k8s_clients.py).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use podstream_sim::{Kubelet, KubeletConfig, Server, SimConfig, WorkerPod};
use podstream_tests::airflow::Airflow;
use podstream_tests::{kubectl, workspace_root};
use serde_json::Value;

struct Node {
    server: Server,
    _kubelet: Kubelet,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

async fn node() -> Node {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = SimConfig {
        namespaces: vec!["airflow".into()],
        ..SimConfig::default()
    };
    let server = Server::start(addr, config).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubelet = Kubelet::start(
        server.cluster().clone(),
        KubeletConfig {
            root: dir.path().join("kubelet"),
            max_pods: None,
            passed_env: Vec::new(),
        },
    )
    .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    Node {
        server,
        _kubelet: kubelet,
        kubeconfig,
        dir,
    }
}

fn script() -> PathBuf {
    workspace_root().join("tests/airflow/k8s_clients.py")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_client_lists_watches_patches_and_deletes() {
    for airflow in Airflow::all() {
        let node = node().await;
        let kubeconfig = node.kubeconfig.clone();
        let home = node.dir.path().join(format!("home-{}", airflow.short()));
        let output = tokio::task::spawn_blocking(move || {
            airflow
                .python(&home)
                .arg(script())
                .args(["client", kubeconfig.to_str().unwrap(), "airflow"])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "Airflow {}: {stderr}",
            airflow.short()
        );
        let seen: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("Airflow {}: {e}: {stderr}", airflow.short()));
        assert_eq!(seen["listed"], serde_json::json!(["py-pod"]));
        let events = seen["events"].as_array().unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"ADDED"), "{events:?}");
        assert_eq!(kinds.last(), Some(&"DELETED"), "{events:?}");
        assert!(
            events.iter().any(|e| e["phase"] == "Running"),
            "the kubelet's Running never reached the watch: {events:?}"
        );
        assert!(
            events.iter().any(|e| e["note"] == "patched"),
            "the patch never reached the watch: {events:?}"
        );
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "MODIFIED" && e["terminating"] == true),
            "no graceful delete seen: {events:?}"
        );
        assert_eq!(node.server.cluster().pod("airflow", "py-pod").ok(), None);
    }
}

/// The provider's watcher for one scheduler, its queued results as JSON lines.
struct JobWatcher {
    child: std::process::Child,
    log: PathBuf,
    seen: std::cell::RefCell<Vec<Value>>,
    lines: mpsc::Receiver<Value>,
}

impl JobWatcher {
    fn start(airflow: Airflow, kubeconfig: &Path, home: &Path, scheduler: &str) -> JobWatcher {
        let mut child = airflow
            .python(home)
            .arg(script())
            .args([
                "watcher",
                kubeconfig.to_str().unwrap(),
                "airflow",
                scheduler,
                "60",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(home.with_extension("watcher.log")).unwrap(),
            ))
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let marker = "podstream-check: ";
                let Some(at) = line.find(marker) else {
                    continue;
                };
                let line = &line[at + marker.len()..];
                let value = if line == "watching" {
                    Value::Null
                } else {
                    serde_json::from_str(line).unwrap_or_else(|_| Value::String(line.to_owned()))
                };
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        let ready = lines.recv_timeout(Duration::from_secs(60));
        assert_eq!(ready, Ok(Value::Null), "the watcher did not start");
        JobWatcher {
            child,
            lines,
            log: home.with_extension("watcher.log"),
            seen: std::cell::RefCell::default(),
        }
    }

    /// The first result for `pod`, whenever it came (results for other pods are kept).
    fn result_for(&self, pod: &str) -> Value {
        loop {
            let found = self.seen.borrow().iter().position(|r| r["pod"] == pod);
            if let Some(at) = found {
                return self.seen.borrow_mut().remove(at)["state"].clone();
            }
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    panic!("the watcher reported nothing for {pod}; its log:\n{log}")
                });
            self.seen.borrow_mut().push(line);
        }
    }
}

impl Drop for JobWatcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn worker_pod(name: &str, script: &str) -> Value {
    let mut pod = WorkerPod::new(name, "7", "etl", name, "manual__1").to_json();
    pod.as_object_mut().unwrap().remove("status");
    pod["spec"]["containers"][0]["command"] = serde_json::json!(["sh", "-c", script]);
    pod["spec"]["containers"][0]["args"] = serde_json::json!([]);
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_job_watcher_gets_the_kubelets_outcomes() {
    for airflow in Airflow::all() {
        let node = node().await;
        let home = node.dir.path().join(format!("home-{}", airflow.short()));
        let watcher = JobWatcher::start(airflow, &node.kubeconfig, &home, "7");
        let file = node.dir.path().join("pods.json");
        let pods = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [worker_pod("fails", "echo about to fail; exit 1"), worker_pod("succeeds", "exit 0")],
        });
        std::fs::write(&file, pods.to_string()).unwrap();
        let (ok, _, stderr) = kubectl(&node.kubeconfig, &["create", "-f", file.to_str().unwrap()]);
        assert!(ok, "{stderr}");
        let version = airflow.short();
        assert_eq!(watcher.result_for("fails"), "failed", "Airflow {version}");
        assert_eq!(
            watcher.result_for("succeeds"),
            Value::Null,
            "Airflow {version}"
        );
        let (ok, log, stderr) = kubectl(&node.kubeconfig, &["logs", "-n", "airflow", "fails"]);
        assert!(ok, "{stderr}");
        assert_eq!(log, "about to fail\n");

        // A relabel away from scheduler 7 leaves its selector without a deletionTimestamp.
        let cluster = node.server.cluster();
        cluster.create_pod(worker_pod("moves", "sleep 30")).unwrap();
        for _ in 0..200 {
            if cluster.pod("airflow", "moves").unwrap()["status"]["phase"] == "Running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (ok, _, stderr) = kubectl(
            &node.kubeconfig,
            &[
                "label",
                "pod",
                "moves",
                "-n",
                "airflow",
                "airflow-worker=8",
                "--overwrite",
            ],
        );
        assert!(ok, "{stderr}");
        assert_eq!(watcher.result_for("moves"), "adopted", "Airflow {version}");
    }
}

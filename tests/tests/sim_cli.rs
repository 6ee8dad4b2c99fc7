//! `podstream sim` as docs/contract.md §4 promises it to scripts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use podstream_tests::{kubectl, podstream_binary};

#[test]
fn sim_prints_its_address_writes_a_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(podstream_binary())
        .args(["sim", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    assert!(
        url.starts_with("http://127.0.0.1:") && !url.ends_with(":0"),
        "{url}"
    );
    assert!(std::fs::read_to_string(&kubeconfig).unwrap().contains(url));

    let (ok, stdout, stderr) = kubectl(&kubeconfig, &["get", "namespaces", "-o", "name"]);
    assert!(ok, "{stderr}");
    assert!(stdout.lines().any(|l| l == "namespace/airflow"), "{stdout}");

    let term = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "sim exited with {status:?} after SIGTERM");
}

/// Whether a process whose command line is exactly `line` runs.
fn running(line: &str) -> bool {
    Command::new("pgrep")
        .args(["-x", "-f", line])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The kubelet's pods never outlive it: killed with SIGKILL (no drop, no signal handler),
/// the processes of the pods it ran go with it, also one that started its own session.
#[test]
fn a_killed_kubelet_leaves_no_pod_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(podstream_binary())
        .args([
            "sim",
            "--kubelet",
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .arg("--kubelet-dir")
        .arg(dir.path().join("kubelet"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // A distinct sleep per test run, and one that leaves the pod's process group as
    // Airflow 2's task runner does (setsid).
    let marker = 3000 + std::process::id() % 1000;
    let plain = format!("sleep {marker}");
    let escaped = format!("sleep {}", marker + 1);
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "long", "namespace": "airflow"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "base", "image": "none",
            "command": ["sh", "-c", format!("setsid {escaped} & exec {plain}")],
        }]},
    });
    let (ok, _, err) = podstream_tests::control_plane::kubectl_with_input(
        &kubeconfig,
        &["create", "-f", "-"],
        &pod.to_string(),
    );
    assert!(ok, "{err}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(running(&plain) && running(&escaped)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod's processes never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    // The kubelet looks for processes that left the container's group once a second.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while running(&plain) || running(&escaped) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pod's processes outlived the kubelet: {plain}: {}, {escaped}: {}",
            running(&plain),
            running(&escaped)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

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

//! `podstream demo` end to end: the simulator, a local nats-server, an Airflow 2.10 SQLite DB
//! made by Airflow, the pipeline; every story must end as semantics.md says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use podstream_tests::nats::nats_server_binary;
use podstream_tests::{podstream_binary, workspace_root};

#[test]
fn demo_plays_every_story_and_exits_0() {
    let output = Command::new(podstream_binary())
        .arg("demo")
        .env("PODSTREAM_NATS_SERVER", nats_server_binary())
        .env(
            "PODSTREAM_DEMO_AIRFLOW_DB",
            workspace_root().join("target/airflow-db/airflow-2.10.sqlite"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.matches(" OK (expected").count(), 5, "{stdout}");
    assert!(stdout.contains("transfer 1→2 (adopted-1)"), "{stdout}");
    assert!(
        stdout.contains("duplicate: twins-1 drives, others twins-2"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fail: deleted_while_running (broken-1)"),
        "{stdout}"
    );
    assert!(!stdout.contains("WRONG"), "{stdout}");
}

#[test]
fn demo_without_an_airflow_db_says_what_to_do() {
    let output = Command::new(podstream_binary())
        .args(["demo", "--airflow-db", "/nonexistent/airflow.db"])
        .env("PODSTREAM_NATS_SERVER", nats_server_binary())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/airflow.db"), "{stderr}");
}

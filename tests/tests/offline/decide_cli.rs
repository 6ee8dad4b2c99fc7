//! `podstream decide` end to end through the built binary (docs/contract.md §1),
//! on the seed stories in `tests/fixtures/`.

// Test code: a panic is the failure report.
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use podstream_tests::{JsonForm, fixture, podstream_binary, workspace_root};
use serde_json::Value;

fn decide_file(name: &str) -> Output {
    let output = Command::new(podstream_binary())
        .arg("decide")
        .arg(fixture(name))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "decide {name} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Every stdout line, parsed: stdout must hold nothing but JSON lines.
fn lines(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
        })
        .collect()
}

fn kinds(lines: &[Value]) -> Vec<&str> {
    lines.iter().map(|l| l["kind"].as_str().unwrap()).collect()
}

fn expected(name: &str) -> Vec<Value> {
    std::fs::read_to_string(fixture(name))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn fixtures_give_their_reviewed_output() {
    for (input, output) in [
        ("seed_000_relabel.jsonl", "seed_000_relabel.expected.jsonl"),
        ("graceful_delete.jsonl", "graceful_delete.expected.jsonl"),
        (
            "seed_003_duplicates.jsonl",
            "seed_003_duplicates.expected.jsonl",
        ),
        (
            "seed_001_restart_relist.json",
            "seed_001_restart_relist.expected.jsonl",
        ),
        (
            "failure_and_success.jsonl",
            "failure_and_success.expected.jsonl",
        ),
        ("malformed.jsonl", "malformed.expected.jsonl"),
        ("task_instance_id.jsonl", "task_instance_id.expected.jsonl"),
        ("spark_drivers.jsonl", "spark_drivers.expected.jsonl"),
    ] {
        assert_eq!(
            lines(&decide_file(input)),
            expected(output),
            "decide {input}"
        );
    }
}

#[test]
fn seed_000_relabel_is_one_transfer_and_no_fail() {
    let out = lines(&decide_file("seed_000_relabel.jsonl"));
    assert_eq!(kinds(&out), ["running", "transfer", "completed"]);
    assert_eq!(
        (out[1]["from"].as_str(), out[1]["to"].as_str()),
        (Some("1"), Some("2"))
    );
    assert_eq!(
        out[2]["owner"], "2",
        "completion is reported under the new owner"
    );
    // The key comes from annotations, not from Airflow's sanitised labels.
    assert_eq!(
        out[0]["ti"]["run_id"],
        "scheduled__2026-11-30T10:00:00+00:00"
    );
}

#[test]
fn graceful_delete_of_a_running_pod_fails_its_task() {
    let out = lines(&decide_file("graceful_delete.jsonl"));
    assert_eq!(kinds(&out), ["running", "fail"]);
    assert_eq!(out[1]["reason"], "deleted_while_running");
}

#[test]
fn seed_003_duplicates_choose_the_running_pod_and_never_fail() {
    let out = lines(&decide_file("seed_003_duplicates.jsonl"));
    assert_eq!(kinds(&out), ["running", "duplicate", "completed"]);
    assert_eq!(out[1]["chosen"]["name"], "spark-submit-a");
    assert_eq!(out[1]["others"][0]["name"], "spark-submit-b");
}

/// Seed 003's own case: Spark driver pods, chosen by what their SparkApplication says.
#[test]
fn spark_drivers_are_chosen_by_their_application_then_by_find_spark_jobs_order() {
    let out = lines(&decide_file("spark_drivers.jsonl"));
    let said: Vec<(&str, &str, &str)> = out
        .iter()
        .map(|line| {
            (
                line["kind"].as_str().unwrap(),
                line["reason"].as_str().unwrap(),
                line["chosen"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            // The application tracks the older running driver, not the newer pending one.
            ("duplicate", "spark_application", "crunch-app-driver"),
            ("duplicate", "spark_application", "crunch-app-driver"),
            // It names a pod that is gone: a pending driver beats a terminating one.
            ("duplicate", "spark_pod_facts", "crunch-app-driver-2"),
        ]
    );
    assert_eq!(out[2]["others"][0]["name"], "crunch-app-driver-3");
}

#[test]
fn seed_001_relisting_after_a_restart_emits_nothing_new() {
    let whole = lines(&decide_file("seed_001_restart_relist.json"));
    // The same stream cut before the pretty-printed re-list.
    let text = std::fs::read_to_string(fixture("seed_001_restart_relist.json")).unwrap();
    let before: String = text.lines().take(3).map(|l| format!("{l}\n")).collect();
    let mut child = Command::new(podstream_binary())
        .arg("decide")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(before.as_bytes())
        .unwrap();
    let watch_only = lines(&child.wait_with_output().unwrap());
    assert_eq!(kinds(&watch_only), ["running", "running"]);
    assert_eq!(whole, watch_only);
    assert_eq!(whole[1]["ti"]["map_index"], 3);
}

#[test]
fn bad_input_is_reported_and_the_stream_goes_on() {
    let output = decide_file("malformed.jsonl");
    let out = lines(&output);
    assert_eq!(
        kinds(&out),
        [
            "invalid", "invalid", "invalid", "invalid", "invalid", "invalid", "invalid", "running"
        ]
    );
    assert!(
        out[..7]
            .iter()
            .all(|l| l["error"].as_str().is_some_and(|e| !e.is_empty()))
    );
    assert_eq!(out[2]["pod"]["name"], "bad-try");
    // Logs went to stderr, not stdout.
    assert!(String::from_utf8_lossy(&output.stderr).contains("pod cannot be projected"));
}

#[test]
fn reading_standard_input_streams_results_as_they_come() {
    let mut child = Command::new(podstream_binary())
        .arg("decide")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let first = std::fs::read_to_string(fixture("graceful_delete.jsonl")).unwrap();
    let first = first.lines().next().unwrap();
    writeln!(stdin, "{first}").unwrap();
    stdin.flush().unwrap();
    // With stdin still open, like `kubectl get -w`, the line must arrive.
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("no output while input stayed open");
    assert_eq!(
        serde_json::from_str::<Value>(&line).unwrap()["kind"],
        "running"
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

#[test]
fn unreadable_input_is_the_only_failure() {
    let output = Command::new(podstream_binary())
        .args(["decide", "/nonexistent/events.json"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot open /nonexistent/events.json")
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn the_bundled_example_stream_runs() {
    let output = Command::new(podstream_binary())
        .arg("decide")
        .arg(workspace_root().join("examples/airflow-worker-pods.jsonl"))
        .output()
        .unwrap();
    assert!(output.status.success());
    let out = lines(&output);
    assert!(
        kinds(&out).contains(&"transfer")
            && kinds(&out).contains(&"duplicate")
            && kinds(&out).contains(&"fail")
    );
    assert!(!kinds(&out).contains(&"invalid"));
}

/// The same watch events compact (as the apiserver sends them), as Python's `json.dumps`
/// writes them, and pretty-printed with kubectl's four-space indent decide to byte-identical
/// output.
#[test]
fn every_json_form_decides_alike() {
    let events: Vec<Value> = std::fs::read_to_string(fixture("failure_and_success.jsonl"))
        .unwrap()
        .lines()
        .chain(
            std::fs::read_to_string(fixture("seed_003_duplicates.jsonl"))
                .unwrap()
                .lines(),
        )
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let decided: Vec<(&str, Vec<u8>)> = JsonForm::ALL
        .iter()
        .map(|form| {
            let name = form.name();
            let mut input = Vec::new();
            for event in &events {
                form.write(event, &mut input);
            }
            let mut child = Command::new(podstream_binary())
                .arg("decide")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(&input).unwrap();
            let output = child.wait_with_output().unwrap();
            assert!(output.status.success(), "{name}");
            (name, output.stdout)
        })
        .collect();
    assert!(!decided[0].1.is_empty());
    assert!(String::from_utf8_lossy(&decided[1].1).lines().count() >= 3);
    for (name, output) in &decided[1..] {
        assert_eq!(
            String::from_utf8_lossy(output),
            String::from_utf8_lossy(&decided[0].1),
            "{name}"
        );
    }
}

//! `podstream replay` over a finished scenario: it prints the commands that were decided, and
//! `--decide` reproduces them with today's rules, or shows where other rules differ.

use podstream_bus::BusConfig;
use std::process::Command as Process;
use std::time::Duration;

use podstream_processor::service::{self, ProcessConfig};
use podstream_proto::subject::stream_names;
use podstream_proto::v1::{ContainerWaiting, Phase};
use podstream_proto::{Command, PodEvent};
use podstream_tests::bus::{self, PodFeed};
use podstream_tests::nats::NatsServer;
use podstream_tests::podstream_binary;
use prost::Message as _;
use serde_json::Value;

fn event(task_id: &str, pod: &str, owner: &str, rv: u64, phase: Phase) -> PodEvent {
    bus::pod_event(task_id, pod, owner, rv, phase)
}

/// A relabel, a success, two pods for one TI, and a pod that cannot pull its image.
fn scenario() -> Vec<PodEvent> {
    let mut bad_image = event("pull", "pull-1", "1", 20, Phase::Pending);
    bad_image.first_app_waiting = Some(ContainerWaiting {
        reason: "ErrImagePull".into(),
        message: "manifest unknown".into(),
        container: "base".into(),
    });
    let mut newer = event("twins", "twins-2", "1", 31, Phase::Pending);
    newer.creation_unix_ms += 1000;
    let mut newer_failed = newer.clone();
    newer_failed.phase = Phase::Failed as i32;
    newer_failed.resource_version = "32".into();
    vec![
        event("load", "load-1", "1", 10, Phase::Running),
        event("load", "load-1", "2", 11, Phase::Running),
        event("load", "load-1", "2", 12, Phase::Succeeded),
        bad_image,
        event("twins", "twins-1", "1", 30, Phase::Running),
        newer,
        newer_failed,
    ]
}

fn replay(nats: &str, args: &[&str]) -> (Vec<Value>, Vec<String>, String) {
    let output = Process::new(podstream_binary())
        .args(["replay", "--nats", nats, "--json"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut json = Vec::new();
    let mut other = Vec::new();
    for line in stdout.lines() {
        match serde_json::from_str::<Value>(line) {
            Ok(value) => json.push(value),
            Err(_) => other.push(line.to_owned()),
        }
    }
    (json, other, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_reproduces_a_finished_scenarios_commands() {
    let nats = NatsServer::start();
    let mut feed = PodFeed::new(&nats.url()).await;
    feed.publish(scenario()).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let processor = tokio::spawn(service::run(
        ProcessConfig {
            bus: BusConfig::at(&nats.url()),
            ..ProcessConfig::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));
    // running, transfer (and its copy for the previous owner), completed; fail (image);
    // running, duplicate.
    bus::settle(
        &feed.js,
        stream_names::COMMANDS,
        7,
        Duration::from_millis(500),
        Duration::from_secs(60),
    )
    .await;
    let _ = stop.send(());
    processor.await.unwrap().unwrap();
    let stored = bus::read_all(&feed.js, stream_names::COMMANDS).await;
    let recorded: Vec<Command> = stored
        .iter()
        .map(|m| Command::decode(m.payload.as_ref()).unwrap())
        .collect();
    assert_eq!(recorded.len(), 7);
    let copies = stored
        .iter()
        .filter(|m| m.header("Podstream-Role") == Some("left"));
    assert_eq!(
        copies.count(),
        1,
        "the transfer's copy for the previous owner"
    );

    let url = nats.url();
    let nats_url = url.clone();
    let (lines, other, stderr) =
        tokio::task::spawn_blocking(move || replay(&nats_url, &["--since", "1", "--decide"]))
            .await
            .unwrap();
    let printed: Vec<&str> = lines
        .iter()
        .filter(|l| l["stream"] == "commands")
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    let ids: Vec<&str> = recorded.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        printed, ids,
        "the timeline shows every recorded command, in order"
    );
    assert_eq!(
        lines.iter().filter(|l| l["stream"] == "pods").count(),
        8,
        "7 events and 1 notice"
    );
    assert!(other.is_empty(), "no differences expected: {other:?}");
    assert!(stderr.contains("0 difference(s)"), "{stderr}");

    // Each command comes after the event it was decided from.
    for (at, line) in lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l["stream"] == "commands")
    {
        let from_event = lines[..at].iter().any(|e| {
            e["stream"] == "pods"
                && e["pod"]["uid"] == line["pod"]["uid"]
                && line["id"]
                    .as_str()
                    .unwrap()
                    .contains(&format!(":{}:", e["resource_version"].as_str().unwrap()))
        });
        assert!(from_event, "{line} before its event");
    }

    // One task only.
    let nats_url = url.clone();
    let (lines, _, _) = tokio::task::spawn_blocking(move || {
        replay(
            &nats_url,
            &["--since", "1", "--task", "etl/twins/manual__2026-11-30/1"],
        )
    })
    .await
    .unwrap();
    assert_eq!(lines.len(), 5, "3 events, running and duplicate: {lines:?}");
    assert!(
        lines.iter().all(|l| l["ti"]["task_id"] == "twins"),
        "{lines:?}"
    );

    // Today's rules without ErrImagePull as fatal: the image failure would not be decided.
    let nats_url = url.clone();
    let (_, other, stderr) = tokio::task::spawn_blocking(move || {
        replay(
            &nats_url,
            &[
                "--since",
                "1",
                "--decide",
                "--fatal-reasons",
                "InvalidImageName",
            ],
        )
    })
    .await
    .unwrap();
    assert!(stderr.contains("1 difference(s)"), "{stderr}");
    assert_eq!(other.len(), 1, "{other:?}");
    assert!(
        other[0].starts_with("then only:") && other[0].contains("uid-pull-1:20:fail"),
        "{other:?}"
    );
}

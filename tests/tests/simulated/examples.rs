//! The examples in `examples/` run against the real pipeline: `follow_commands.py` (nats-py,
//! protobuf and the shipped schema, no Airflow), logged in as the shipped users file's
//! `podstream-reader`, prints scheduler 1's commands as the ingest and the processor (each
//! with its own user) make them from a pod's life on the simulator.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use podstream_bus::{BusConfig, NatsCredentials, NatsSecurity};
use podstream_ingest::service::{self as ingest, IngestConfig};
use podstream_processor::service::{self as process, ProcessConfig};
use podstream_sim::{Server, SimConfig, WorkerPod};
use podstream_tests::airflow::Airflow;
use podstream_tests::kube_client;
use podstream_tests::nats::NatsServer;
use podstream_tests::workspace_root;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_consumer_follows_one_schedulers_commands() {
    // The shipped users file, each password in a file of its own.
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_with_shipped_users(dir.path(), "example-password");
    let bus_as = |user: &str| BusConfig {
        security: NatsSecurity {
            credentials: NatsCredentials::UserPassword {
                user: format!("podstream-{user}"),
                password_file: dir.path().join(user),
            },
            ..NatsSecurity::default()
        },
        ..BusConfig::at(&nats.url())
    };
    let sim = Server::start(
        "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        SimConfig {
            namespaces: vec!["airflow".into()],
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let ingest = tokio::spawn(ingest::run(
        IngestConfig {
            bus: bus_as("ingest"),
            ..IngestConfig::default()
        },
        kube_client(&sim).await,
        until_stopped(stopped.clone()),
    ));
    let processor = tokio::spawn(process::run(
        ProcessConfig {
            bus: bus_as("process"),
            ..ProcessConfig::default()
        },
        until_stopped(stopped.clone()),
    ));

    // Any Python with nats-py and protobuf runs it; an Airflow venv has both.
    let python = Airflow::newest().venv_bin().join("python");
    let mut follower = Command::new(&python)
        .arg(workspace_root().join("examples/follow_commands.py"))
        .args(["--nats", &nats.url(), "--scheduler", "1", "--from-start"])
        .args(["--user", "podstream-reader", "--password-file"])
        .arg(dir.path().join("reader"))
        .args(["--count", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let mut ready = String::new();
    BufReader::new(follower.stderr.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert!(
        ready.starts_with("following podstream.commands.1.*"),
        "{ready}"
    );
    let (lines, received) = mpsc::channel();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });

    // Scheduler 2's pod is not scheduler 1's news; scheduler 1's runs, then fails.
    let cluster = sim.cluster();
    for (name, owner) in [("other", "2"), ("task-a", "1")] {
        cluster
            .create_pod(WorkerPod::new(name, owner, "etl", name, "r1").to_json())
            .unwrap();
        cluster.set_phase("airflow", name, "Running").unwrap();
    }
    cluster.set_phase("airflow", "task-a", "Failed").unwrap();

    let mut printed = Vec::new();
    while printed.len() < 2 {
        let line = received
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the example printed only {printed:#?}"));
        printed.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    let kinds: Vec<bool> = printed
        .iter()
        .map(|line| line.get("running").is_some())
        .collect();
    assert_eq!(
        kinds,
        [true, false],
        "running, then the failure: {printed:#?}"
    );
    assert!(printed[1].get("fail").is_some(), "{printed:#?}");
    for line in &printed {
        assert_eq!(line["owner"], "1", "{line}");
        assert_eq!(line["role"], "event", "{line}");
        assert_eq!(line["pod"]["name"], "task-a", "{line}");
        assert_eq!(line["task"]["task_id"], "task-a", "{line}");
    }
    // It stops after --count lines.
    let status = follower.wait().unwrap();
    assert!(status.success(), "the example exited with {status}");

    stop.send(true).unwrap();
    ingest.await.unwrap().unwrap();
    processor.await.unwrap().unwrap();
    // Nothing any of them did was refused.
    let log = nats.log();
    assert!(!log.contains("Violation"), "{log}");
}

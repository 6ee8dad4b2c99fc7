//! `podstream tail` shows a relabel on both schedulers' subjects.

use podstream_bus::BusConfig;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use podstream_ingest::service::{self, IngestConfig};
use podstream_sim::{Server, SimConfig, WorkerPod};
use podstream_tests::nats::NatsServer;
use podstream_tests::{kube_client, podstream_binary};
use serde_json::Value;

struct Tail {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Tail {
    fn start(nats: &str, extra: &[&str]) -> Tail {
        let mut child = Command::new(podstream_binary())
            .args(["tail", "--json", "--nats", nats])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert!(ready.starts_with("tailing"), "{ready}");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                    break;
                }
            }
        });
        Tail { child, lines }
    }

    /// Lines until one matches, or a panic after 20 s.
    fn until(&self, what: &str, matches: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("no line for {what}; saw {seen:#?}"));
            let found = matches(&line);
            seen.push(line);
            if found {
                return seen;
            }
        }
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_shows_a_relabel_on_both_schedulers_subjects() {
    let nats = NatsServer::start();
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let sim = Server::start(
        addr,
        SimConfig {
            namespaces: vec!["airflow".into()],
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let everyone = Tail::start(&nats.url(), &[]);
    let scheduler_1 = Tail::start(&nats.url(), &["--scheduler", "1"]);
    let config = IngestConfig {
        bus: BusConfig::at(&nats.url()),
        ..IngestConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let ingest = tokio::spawn(service::run(config, kube_client(&sim).await, async move {
        let _ = stopped.await;
    }));

    sim.cluster()
        .create_pod(WorkerPod::new("task-a", "1", "etl", "extract", "r1").to_json())
        .unwrap();
    everyone.until("the pod's first event", |l| l["pod"]["name"] == "task-a");
    sim.cluster()
        .relabel("airflow", "task-a", "airflow-worker", Some("2"))
        .unwrap();

    let seen = everyone.until("both subjects", |l| l["role"] == "left");
    let event = seen
        .iter()
        .find(|l| l["role"] == "event" && l["owner"] == "2")
        .expect("the event on scheduler 2's subject");
    assert_eq!(event["subject_owner"], "2");
    let notice = seen.last().unwrap();
    assert_eq!(
        (notice["subject_owner"].as_str(), notice["owner"].as_str()),
        (Some("1"), Some("2"))
    );
    assert_eq!(
        notice["subject"].as_str().unwrap(),
        format!(
            "podstream.pods.1.{}",
            notice["pod"]["uid"].as_str().unwrap()
        )
    );

    // Scheduler 1's view: its pod's creation, then the notice that it left; never scheduler 2's.
    let mine = scheduler_1.until("the notice", |l| l["role"] == "left");
    assert!(mine.iter().all(|l| l["subject_owner"] == "1"), "{mine:#?}");

    let _ = stop.send(());
    ingest.await.unwrap().unwrap();
}

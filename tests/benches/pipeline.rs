//! The whole pipeline, `podstream run` (release build, its own process), from a pod change in
//! the simulator to the commit of its command in PostgreSQL, beside the raw JetStream publish
//! limit measured the same way as in the ingest bench.
//!
//! `cargo bench -p podstream-tests --bench pipeline`:
//! 1. raw limit: N messages of a PodEvent's size, ingest's ack window;
//! 2. paced: new Running worker pods (one event, one `running` command each) at 1k/s and at
//!    10k/s for 10 s; latency = `podstream_applied.applied_at` (the sink's transaction time)
//!    minus the moment the pod was written to the simulator;
//! 3. burst: N pods at once; end-to-end events/s = N / time until the last commit.
//!
//! The TIs exist in an Airflow 2.10 database made by `airflow db migrate` (on PostgreSQL).
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use podstream_proto::subject::stream_names;
use podstream_sim::{Cluster, Server, SimConfig, WorkerPod};
use podstream_sink::Database;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::bus;
use podstream_tests::nats::NatsServer;
use podstream_tests::postgres::PgCluster;
use sqlx::Row;

const DAG: &str = "bench";
const RUN: &str = "manual__bench";
const WINDOW: usize = 1024;

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn pod(phase: &str, i: usize) -> serde_json::Value {
    let task = format!("{phase}-{i:06}");
    let mut pod = WorkerPod::new(&task, "1", DAG, &task, RUN).to_json();
    pod["status"]["phase"] = "Running".into();
    pod
}

/// Creates `count` pods at `rate` per second (0 = at once); returns uid → creation time.
fn drive(cluster: Cluster, phase: &'static str, count: usize, rate: usize) -> HashMap<String, f64> {
    let mut created = HashMap::with_capacity(count);
    let per_slice = if rate == 0 {
        count
    } else {
        (rate / 100).max(1)
    };
    let mut next = Instant::now();
    let mut done = 0;
    while done < count {
        for _ in 0..per_slice.min(count - done) {
            let made = cluster.create_pod(pod(phase, done)).unwrap();
            let uid = made["metadata"]["uid"].as_str().unwrap().to_owned();
            created.insert(uid, now_s());
            done += 1;
        }
        next += Duration::from_millis(10);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    created
}

/// Waits until every pod's `running` command is committed; returns (latencies in ms sorted,
/// seconds from the first creation to the last commit).
async fn committed(db: &Database, created: &HashMap<String, f64>) -> (Vec<f64>, f64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let rows = sqlx::query(
            "SELECT command_id, CAST(EXTRACT(EPOCH FROM applied_at) AS DOUBLE PRECISION) FROM podstream_applied",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let mut latencies = Vec::with_capacity(created.len());
        let mut last: f64 = 0.0;
        for row in rows {
            let id: String = row.try_get(0).unwrap();
            let at: f64 = row.try_get(1).unwrap();
            let uid = id.split(':').next().unwrap_or_default();
            if let Some(made) = created.get(uid) {
                latencies.push((at - made) * 1000.0);
                last = last.max(at);
            }
        }
        if latencies.len() >= created.len() {
            latencies.sort_by(f64::total_cmp);
            let first = created.values().copied().fold(f64::MAX, f64::min);
            return (latencies, last - first);
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} committed",
            latencies.len(),
            created.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Per stage, from JetStream's own timestamps: each event's latency (simulator → pods stream
/// for the ingest, pods stream → commands stream for the processor), and when the stage had
/// passed on the last of them, in seconds after the first pod was created.
struct Stages {
    ingest: Vec<f64>,
    process: Vec<f64>,
    ingest_done: f64,
    process_done: f64,
}

async fn stages(js: &jetstream::Context, created: &HashMap<String, f64>) -> Stages {
    let first = created.values().copied().fold(f64::MAX, f64::min);
    let (mut ingest_done, mut process_done) = (first, first);
    let mut event_at = HashMap::new();
    let mut ingest = Vec::new();
    for message in bus::read_all(js, stream_names::PODS).await {
        let event = message.pod_event();
        let uid = event.pod.map(|p| p.uid).unwrap_or_default();
        if let Some(made) = created.get(&uid) {
            ingest.push((message.published - made) * 1000.0);
            ingest_done = ingest_done.max(message.published);
            event_at.insert(uid, message.published);
        }
    }
    let mut process = Vec::new();
    for message in bus::read_all(js, stream_names::COMMANDS).await {
        let command =
            <podstream_proto::Command as prost::Message>::decode(message.payload.as_ref()).unwrap();
        let uid = command.pod.map(|p| p.uid).unwrap_or_default();
        if let Some(at) = event_at.get(&uid) {
            process.push((message.published - at) * 1000.0);
            process_done = process_done.max(message.published);
        }
    }
    ingest.sort_by(f64::total_cmp);
    process.sort_by(f64::total_cmp);
    Stages {
        ingest,
        process,
        ingest_done: ingest_done - first,
        process_done: process_done - first,
    }
}

impl Stages {
    fn print_latencies(&self) {
        for (stage, values) in [("ingest", &self.ingest), ("processor", &self.process)] {
            println!(
                "  {stage:>9}: p50 {:>6.1} ms, p99 {:>6.1} ms",
                percentile(values, 0.5),
                percentile(values, 0.99)
            );
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(at).copied().unwrap_or(f64::NAN)
}

async fn seed(db: &Database, phases: &[(&str, usize)]) {
    db.seed(DAG, RUN, &[]).await.unwrap();
    for (phase, count) in phases {
        let prefix = format!("{phase}-");
        podstream_tests::sink::seed_running_tis(db, DAG, RUN, &prefix, 0..*count, 6).await;
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (paced, burst, seconds) = if full {
        (vec![1_000, 10_000], 50_000, 10)
    } else {
        (vec![200], 500, 1)
    };
    let binary = podstream_tests::bench_binary(full);
    let runtime = podstream_tests::bench_runtime();
    runtime.block_on(async move {
        let nats = NatsServer::start();
        let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let size = 180;
        let raw_n = if full { 100_000 } else { 1_000 };
        let raw = bus::raw_publish_limit(&js, raw_n, size, WINDOW, bus::RawShape::Bare).await;
        println!("raw JetStream publish limit: {raw:>9.0} msgs/s ({raw_n} messages of {size} bytes, window {WINDOW})");

        let pg = PgCluster::start();
        let target = AirflowDb::postgres(Airflow::line("2.10"), &pg, "bench");
        let db = Database::connect(&target.url).await.unwrap();
        let mut phases: Vec<(String, usize)> = paced
            .iter()
            .map(|rate| (format!("paced{rate}"), rate * seconds))
            .collect();
        phases.push(("burst".into(), burst));
        let phase_refs: Vec<(&str, usize)> = phases.iter().map(|(p, c)| (p.as_str(), *c)).collect();
        seed(&db, &phase_refs).await;

        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let retain = phases.iter().map(|(_, c)| c).sum::<usize>() + 16;
        let sim = Server::start(addr, SimConfig { namespaces: vec!["airflow".into()], retain_events: retain, ..SimConfig::default() }).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let mut child = Command::new(&binary)
            .args(["run", "--nats", &nats.url(), "--db", &target.url, "--namespaces", "airflow"])
            .env("KUBECONFIG", &kubeconfig)
            .env("PODSTREAM_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Warm up: the streams, consumers and the first list exist before the clock runs.
        tokio::time::sleep(Duration::from_secs(2)).await;

        for rate in &paced {
            let cluster = sim.cluster().clone();
            let phase: &'static str = Box::leak(format!("paced{rate}").into_boxed_str());
            let count = rate * seconds;
            let rate = *rate;
            let created = tokio::task::spawn_blocking(move || drive(cluster, phase, count, rate)).await.unwrap();
            let (latencies, span) = committed(&db, &created).await;
            if rate <= 1_000 {
                stages(&js, &created).await.print_latencies();
            }
            println!(
                "paced {rate:>6}/s for {seconds} s: {count} commits in {span:.2} s = {:>7.0} events/s; latency p50 {:>6.1} ms, p99 {:>6.1} ms, max {:>6.1} ms",
                count as f64 / span,
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.99),
                latencies.last().copied().unwrap_or(f64::NAN)
            );
        }
        let cluster = sim.cluster().clone();
        let created = tokio::task::spawn_blocking(move || drive(cluster, "burst", burst, 0)).await.unwrap();
        let (latencies, span) = committed(&db, &created).await;
        let rate = burst as f64 / span;
        println!(
            "burst: {burst} pods at once, last commit after {span:.2} s = {rate:>7.0} events/s end to end ({:.2}x the raw limit); p50 {:.0} ms, p99 {:.0} ms",
            rate / raw,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99)
        );
        // Which stage holds the burst back: when each had passed on the last pod.
        let burst_stages = stages(&js, &created).await;
        println!(
            "  every pod event stored after {:.2} s (ingest), every command after {:.2} s (processor), every commit after {span:.2} s (sink)",
            burst_stages.ingest_done, burst_stages.process_done
        );
        let (rss_now, rss_peak) = podstream_tests::rss_mb(child.id());
        println!("podstream run memory: {rss_now} MB resident, {rss_peak} MB peak");
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let _ = child.wait();
    });
}

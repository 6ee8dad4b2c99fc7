//! The ingest's throughput and memory beside the raw JetStream publish limit, in one run.
//!
//! `cargo bench -p podstream-tests --bench ingest` starts a nats-server and the simulator, then
//! measures in rounds, each one side by side on the same nats-server (a lone pair of figures
//! moved by ±20% on a shared 2-core machine):
//! 1. raw limit: publishes N messages of a PodEvent's size with message ids and the ingest's
//!    ack window, straight to a fresh stream with the pod stream's settings (the baseline);
//!    then again with the ingest's own subjects (a uid each) and headers;
//! 2. initial list: N Airflow pods exist, `podstream ingest` (release build, its own process)
//!    starts on an empty pod stream and checkpoint, and the clock runs until the pod stream
//!    holds N acked events.
//!
//! Each round's ratio is printed and their median is the headline. The last round's ingest
//! then goes on:
//! 3. the ingest process's resident memory with N live pods;
//! 4. steady: 10k pod updates per second for 10 s while it runs (and the checkpoint's KV writes).
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use k8s_openapi::api::core::v1::Pod;
use podstream_bus::streams;
use podstream_ingest::projection::project;
use podstream_ingest::service;
use podstream_proto::subject::stream_names;
use podstream_proto::v1::EventType;
use podstream_sim::{Server, SimConfig, WorkerPod};
use podstream_tests::bus::{self, RawShape};
use podstream_tests::nats::NatsServer;
use prost::Message as _;

const WINDOW: usize = 1024;
/// How long the memory is left to settle before it is read again.
const SETTLE: Duration = Duration::from_secs(2);

fn worker(i: usize) -> serde_json::Value {
    let name = format!("etl-task-{i:06}");
    let mut pod = WorkerPod::new(
        &name,
        &(1 + i % 4).to_string(),
        "daily_etl",
        &name,
        "scheduled__2026-11-30T10:00:00+00:00",
    )
    .to_json();
    pod["metadata"]["uid"] = serde_json::json!(format!("00000000-0000-0000-0000-{i:012}"));
    pod["metadata"]["resourceVersion"] = serde_json::json!("1");
    pod["status"]["phase"] = serde_json::json!("Running");
    pod
}

fn event_size() -> usize {
    let pod: Pod = serde_json::from_value(worker(1)).unwrap();
    project(EventType::Modified, &pod)
        .unwrap()
        .encode_to_vec()
        .len()
}

/// KV writes to the ingest's checkpoint so far, and the average size of a key's value (KB).
async fn checkpoint_writes(js: &jetstream::Context) -> (u64, f64) {
    let name = streams::bucket_stream(service::DEFAULT_CHECKPOINT_BUCKET);
    let mut stream = js.get_stream(name).await.unwrap();
    let state = stream.info().await.unwrap().state.clone();
    (
        state.last_sequence,
        state.bytes as f64 / state.messages.max(1) as f64 / 1024.0,
    )
}

/// CPU seconds that nats-server and this process (the raw publisher, or the simulator) use
/// from the moment it is made.
struct CpuSince {
    nats: u32,
    start: (f64, f64),
}

impl CpuSince {
    fn now(nats: u32) -> CpuSince {
        CpuSince {
            nats,
            start: (
                podstream_tests::cpu_seconds(nats),
                podstream_tests::cpu_seconds(std::process::id()),
            ),
        }
    }

    /// (nats-server, this process) since then.
    fn used(&self) -> (f64, f64) {
        (
            podstream_tests::cpu_seconds(self.nats) - self.start.0,
            podstream_tests::cpu_seconds(std::process::id()) - self.start.1,
        )
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (n, rate, seconds, rounds) = if full {
        (100_000, 10_000, 10, 3)
    } else {
        (1_000, 1_000, 1, 1)
    };
    let binary = podstream_tests::bench_binary(full);
    let runtime = podstream_tests::bench_runtime();
    runtime.block_on(async move {
        let nats = NatsServer::start();
        let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let size = event_size();
        let nats_pid = nats.pid().unwrap();

        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let sim = Server::start(addr, SimConfig { namespaces: vec!["airflow".into()], retain_events: n * 2 + 16, ..SimConfig::default() }).await.unwrap();
        for i in 0..n {
            sim.cluster().create_pod(worker(i)).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();

        println!("{n} messages of {size} bytes, ack window {WINDOW}, {rounds} rounds");
        let mut ratios = Vec::new();
        let mut shaped_ratios = Vec::new();
        let mut child = None;
        for round in 1..=rounds {
            println!("round {round}:");
            let cpu = CpuSince::now(nats_pid);
            let raw = bus::raw_publish_limit(&js, n, size, WINDOW, RawShape::Bare).await;
            let (nats_cpu, publisher_cpu) = cpu.used();
            println!("  raw JetStream publish limit: {raw:>9.0} msgs/s (CPU: nats-server {nats_cpu:.2} s, the publisher, this process, {publisher_cpu:.2} s)");
            // The same, with the ingest's subjects (a uid each) and headers: what JetStream
            // itself does for exactly the messages the ingest sends.
            let cpu = CpuSince::now(nats_pid);
            let shaped = bus::raw_publish_limit(&js, n, size, WINDOW, RawShape::LikeIngest).await;
            let (nats_cpu, publisher_cpu) = cpu.used();
            println!("  raw, the ingest's subjects and headers: {shaped:>9.0} msgs/s (CPU: nats-server {nats_cpu:.2} s, the publisher {publisher_cpu:.2} s)");

            // Each round's ingest starts from nothing, like the first.
            let _ = js.delete_stream(stream_names::PODS).await;
            let _ = js.delete_key_value("podstream-ingest").await;
            let cpu = CpuSince::now(nats_pid);
            let started = Instant::now();
            let ingest = Command::new(&binary)
                .args(["ingest", "--nats", &nats.url()])
                .env("KUBECONFIG", &kubeconfig)
                .env("PODSTREAM_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            bus::settle(&js, stream_names::PODS, n as u64, Duration::from_millis(1), Duration::from_secs(600)).await;
            let initial = started.elapsed().as_secs_f64();
            let ingest_cpu = podstream_tests::cpu_seconds(ingest.id());
            let (nats_cpu, simulator_cpu) = cpu.used();
            let rate = n as f64 / initial;
            println!(
                "  initial list: {n} pods acked in {initial:.2} s = {rate:>9.0} events/s: {:.2}x the raw limit, {:.2}x the shaped one",
                rate / raw,
                rate / shaped
            );
            println!(
                "  CPU over the initial list: ingest {ingest_cpu:.2} s, nats-server {nats_cpu:.2} s, the simulator serving it (this process) {simulator_cpu:.2} s, of {:.2} s on two cores",
                2.0 * initial
            );
            ratios.push(rate / raw);
            shaped_ratios.push(rate / shaped);
            if round < rounds {
                stop(ingest);
            } else {
                child = Some(ingest);
            }
        }
        let Some(child) = child else { return };
        println!(
            "initial list against the raw limit: median {:.2}x over {rounds} rounds ({}); against the shaped one: median {:.2}x",
            median(&ratios),
            ratios.iter().map(|r| format!("{r:.2}x")).collect::<Vec<_>>().join(", "),
            median(&shaped_ratios)
        );

        let (rss_now, rss_peak) = podstream_tests::rss_mb(child.id());
        // mimalloc returns freed pages a second after the free (its purge delay): the
        // resident set at the last ack still holds the list's garbage.
        tokio::time::sleep(SETTLE).await;
        let (rss_settled, _) = podstream_tests::rss_mb(child.id());
        println!(
            "ingest memory with {n} live pods: {rss_now} MB resident just after the last ack, {rss_settled} MB {:.0} s later, {rss_peak} MB peak",
            SETTLE.as_secs_f64()
        );
        let (writes_listed, size) = checkpoint_writes(&js).await;
        println!("checkpoint: {writes_listed} KV writes for the initial list ({n} events), {size:.1} KB a key on average");
        // Steady load: `rate` updates per second, paced in 10 ms slices.
        let cluster = sim.cluster().clone();
        let updates = rate * seconds;
        let started = Instant::now();
        let driver = tokio::task::spawn_blocking(move || {
            let per_slice = rate / 100;
            let mut done = 0;
            let mut next = Instant::now();
            while done < updates {
                for _ in 0..per_slice {
                    let name = format!("etl-task-{:06}", done % n);
                    cluster
                        .modify_pod("airflow", &name, |pod| pod["metadata"]["annotations"]["beat"] = serde_json::json!(done.to_string()))
                        .unwrap();
                    done += 1;
                }
                next += Duration::from_millis(10);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        driver.await.unwrap();
        let offered = started.elapsed();
        bus::settle(&js, stream_names::PODS, (n + updates) as u64, Duration::from_millis(1), Duration::from_secs(600)).await;
        let drained = started.elapsed();
        println!(
            "steady: {updates} updates offered at {:>6.0}/s, all acked after {:.2} s = {:>9.0} events/s (lag at the end {:.2} s)",
            updates as f64 / offered.as_secs_f64(),
            drained.as_secs_f64(),
            updates as f64 / drained.as_secs_f64(),
            (drained - offered).as_secs_f64()
        );
        let (writes, size) = checkpoint_writes(&js).await;
        let steady_writes = writes - writes_listed;
        println!(
            "checkpoint: {steady_writes} KV writes during the steady run ({updates} events), about {:.1} MB/s",
            steady_writes as f64 * size / 1024.0 / drained.as_secs_f64()
        );
        let (rss_now, rss_peak) = podstream_tests::rss_mb(child.id());
        println!("ingest memory after the steady run: {rss_now} MB resident, {rss_peak} MB peak");
        stop(child);
    });
}

/// Stops an ingest the way Kubernetes would (SIGTERM) and waits for it.
fn stop(mut ingest: std::process::Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(ingest.id().to_string())
        .status();
    let _ = ingest.wait();
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

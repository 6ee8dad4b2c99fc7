//! Each stage alone beside the whole pipeline, in one run, with the CPU each process spent.
//!
//! `cargo bench -p podstream-tests --bench stages`, on a real nats-server, PostgreSQL (an
//! Airflow 2.10 database made by `airflow db migrate`) and the simulator:
//! 1. the raw JetStream publish limit, as the ingest and pipeline benches measure it;
//! 2. **ingest alone**: N Running worker pods exist; `podstream ingest` starts and lists them
//!    onto the pods stream (one event each);
//!    N more pods are then made while it watches, whose events say the pod is new, as in a
//!    running pipeline (a listed pod's cannot);
//! 3. **processor alone**: `podstream process` over that pre-filled pods stream: the listed
//!    pods (each costs a record read and a search of the stream), then the watched ones;
//! 4. **sink alone**: `podstream sink` over that pre-filled commands stream, until all 2N are
//!    committed;
//! 5. **the whole**: `podstream run`, and N new pods at once, until all N are committed.
//!
//! For each: events/s and CPU-seconds per 1,000 events of podstream's process, nats-server and
//! PostgreSQL (every `postgres` process, its reaped children included). Without `--bench` (as
//! `cargo test --all-targets` runs it) it does a small smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use podstream_proto::subject::stream_names;
use podstream_sim::{Cluster, Server, SimConfig, WorkerPod};
use podstream_sink::Database;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::bus;
use podstream_tests::component::Component;
use podstream_tests::nats::NatsServer;
use podstream_tests::postgres::PgCluster;

const NS: &str = "airflow";
const DAG: &str = "stages";
const RUN: &str = "manual__stages";
const WINDOW: usize = 1024;

/// Seconds of CPU (user + system) a process and its reaped children have used.
fn cpu_seconds(pid: u32) -> f64 {
    podstream_tests::ProcessCpu::of(pid).map_or(0.0, podstream_tests::ProcessCpu::with_children)
}

/// CPU-seconds of every `postgres` process now running.
fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres")
        })
        .map(cpu_seconds)
        .sum()
}

/// The CPU clocks of the processes a stage runs beside.
#[derive(Clone, Copy)]
struct Clocks {
    podstream: f64,
    nats: f64,
    postgres: f64,
}

impl Clocks {
    fn read(podstream: u32, nats: u32) -> Clocks {
        Clocks {
            podstream: cpu_seconds(podstream),
            nats: cpu_seconds(nats),
            postgres: postgres_cpu_seconds(),
        }
    }
}

/// Prints one stage's figures; returns its events/s.
fn report(stage: &str, n: usize, seconds: f64, before: Clocks, after: Clocks, raw: f64) -> f64 {
    let per_1k = |a: f64, b: f64| (a - b) * 1000.0 / n as f64;
    let rate = n as f64 / seconds;
    println!(
        "{stage:>15}: {n} events in {seconds:6.2} s = {rate:>8.0} events/s ({:.2}x the raw limit); \
         CPU-s per 1k events: podstream {:.3}, nats-server {:.3}, PostgreSQL {:.3}",
        rate / raw,
        per_1k(after.podstream, before.podstream),
        per_1k(after.nats, before.nats),
        per_1k(after.postgres, before.postgres),
    );
    rate
}

/// Creates `count` Running worker pods named `<prefix>-NNNNNN`, one event each.
fn create_pods(cluster: &Cluster, prefix: &str, count: usize) {
    for i in 0..count {
        let task = format!("{prefix}-{i:06}");
        let mut pod = WorkerPod::new(&task, "1", DAG, &task, RUN).to_json();
        pod["status"]["phase"] = "Running".into();
        cluster.create_pod(pod).unwrap();
    }
}

async fn applied(db: &Database) -> u64 {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM podstream_applied")
        .fetch_one(&db.pool)
        .await
        .unwrap_or((0,));
    u64::try_from(n).unwrap_or(0)
}

/// Polls `reached` until it is true; the seconds since `start`.
async fn until<F: std::future::Future<Output = bool>>(
    start: Instant,
    what: &str,
    mut reached: impl FnMut() -> F,
) -> f64 {
    let deadline = start + Duration::from_secs(900);
    while !reached().await {
        assert!(Instant::now() < deadline, "{what}: not within 900 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed().as_secs_f64()
}

fn start(binary: &Path, args: &[&str], kubeconfig: &Path) -> Component {
    Component::start(binary, args, kubeconfig)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n = if full { 50_000 } else { 500 };
    let binary = podstream_tests::bench_binary(full);
    podstream_tests::bench_runtime().block_on(async move {
        let nats = NatsServer::start();
        let nats_pid = nats.pid().unwrap();
        let url = nats.url();
        let js = jetstream::new(async_nats::connect(&url).await.unwrap());
        let raw = bus::raw_publish_limit(&js, n, 180, WINDOW, bus::RawShape::Bare).await;
        println!("raw JetStream publish limit: {raw:.0} msgs/s ({n} messages of 180 bytes)");

        let pg = PgCluster::start();
        let target = AirflowDb::postgres(Airflow::line("2.10"), &pg, "stages");
        let db = Database::connect(&target.url).await.unwrap();
        db.seed(DAG, RUN, &[]).await.unwrap();
        for prefix in ["alone-", "watched-", "whole-"] {
            podstream_tests::sink::seed_running_tis(&db, DAG, RUN, prefix, 0..n, 6).await;
        }

        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let config = SimConfig {
            namespaces: vec![NS.into()],
            retain_events: 3 * n + 16,
            ..SimConfig::default()
        };
        let sim = Server::start(addr, config).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let cluster = sim.cluster().clone();
        tokio::task::spawn_blocking(move || create_pods(&cluster, "alone", n))
            .await
            .unwrap();
        let n64 = n as u64;

        let ingest = start(&binary, &["ingest", "--nats", &url, "--namespaces", NS], &kubeconfig);
        let (t0, before) = (Instant::now(), Clocks::read(ingest.id(), nats_pid));
        let seconds = until(t0, "the pods stream", || async {
            bus::count(&js, stream_names::PODS).await >= n64
        })
        .await;
        let ingest_rate = report("ingest alone", n, seconds, before, Clocks::read(ingest.id(), nats_pid), raw);
        // Pods made while the ingest watches: their events say the pod is new
        // (`previous_sequence` 0), as in a running pipeline; listed ones cannot.
        let cluster = sim.cluster().clone();
        tokio::task::spawn_blocking(move || create_pods(&cluster, "watched", n))
            .await
            .unwrap();
        until(Instant::now(), "the watched pods", || async {
            bus::count(&js, stream_names::PODS).await >= 2 * n64
        })
        .await;
        ingest.terminate();

        // The stream holds the listed pods first, then the watched ones.
        let process = start(&binary, &["process", "--nats", &url], &kubeconfig);
        let (t0, before) = (Instant::now(), Clocks::read(process.id(), nats_pid));
        let listed_seconds = until(t0, "the listed pods' commands", || async {
            bus::count(&js, stream_names::COMMANDS).await >= n64
        })
        .await;
        let middle = Clocks::read(process.id(), nats_pid);
        let t1 = Instant::now();
        report("processor, listed pods", n, listed_seconds, before, middle, raw);
        let seconds = until(t1, "the watched pods' commands", || async {
            bus::count(&js, stream_names::COMMANDS).await >= 2 * n64
        })
        .await;
        let process_rate = report("processor, watched pods", n, seconds, middle, Clocks::read(process.id(), nats_pid), raw);
        process.terminate();

        let sink = start(&binary, &["sink", "--nats", &url, "--db", &target.url], &kubeconfig);
        let (t0, before) = (Instant::now(), Clocks::read(sink.id(), nats_pid));
        let seconds = until(t0, "the sink", || async { applied(&db).await >= 2 * n64 }).await;
        let sink_rate = report("sink alone", 2 * n, seconds, before, Clocks::read(sink.id(), nats_pid), raw);
        sink.terminate();

        let run = start(&binary, &["run", "--nats", &url, "--db", &target.url, "--namespaces", NS], &kubeconfig);
        // The streams, consumers and the first list exist before the clock runs.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let cluster = sim.cluster().clone();
        let (t0, before) = (Instant::now(), Clocks::read(run.id(), nats_pid));
        tokio::task::spawn_blocking(move || create_pods(&cluster, "whole", n))
            .await
            .unwrap();
        let seconds = until(t0, "the whole pipeline", || async { applied(&db).await >= 3 * n64 }).await;
        let whole_rate = report("whole (run)", n, seconds, before, Clocks::read(run.id(), nats_pid), raw);
        run.terminate();

        let slowest = ingest_rate.min(process_rate).min(sink_rate);
        println!(
            "slowest stage alone {slowest:.0} events/s; the whole at {:.2}x of it; the processor alone at {:.2}x the raw limit",
            whole_rate / slowest,
            process_rate / raw
        );
    });
}

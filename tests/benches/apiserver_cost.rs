//! What watching worker pods costs the Kubernetes API server: N stock schedulers' label-scoped
//! watches beside one podstream ingest (an HA pair) serving them, on a real kube-apiserver
//! (and etcd) from `scripts/setup.sh`, in one run.
//!
//! `cargo bench -p podstream-tests --bench apiserver_cost [-- --standing N --churned M
//! --rounds R]`:
//! 1. N standing worker pods (10,000), Running, owned round-robin by four scheduler job ids
//!    (`airflow-worker=<id>`), made once;
//! 2. per configuration, the same churn: M more pods (2,000), each created Pending, patched
//!    Running, then Succeeded (`pods/status`), then deleted, 16 requests in flight, while
//!    - nothing watches: the churn's own cost, the constant under every other line;
//!    - 1, 2 or 4 stock schedulers watch: each sends the request Airflow's
//!      `KubernetesJobWatcher` sends (cncf.kubernetes 10.x: `list_namespaced_pod(watch=True,
//!      label_selector="airflow-worker=<id>,airflow_executor_done!=True",
//!      resource_version="0", timeout_seconds=3600)`: no list, every matching pod as an ADDED
//!      event from the watch cache first), each on a connection of its own; together they own
//!      every pod (with fewer than four, one scheduler's selector names several ids:
//!      `airflow-worker in (0,2)`); the watchers are this process's, not Airflow's Python;
//!    - podstream: two `podstream ingest` processes electing a leader through their Lease, the
//!      leader listing and watching every worker pod, publishing to a local nats-server;
//! 3. per configuration: kube-apiserver's CPU seconds (`/proc/<pid>/stat`, from the watchers'
//!    start until a second after the churn), the pod watch events and bytes it sent and the bytes of its pod
//!    LIST answers (its own `apiserver_watch_events_total`, `apiserver_watch_events_sizes_sum`
//!    and `apiserver_response_sizes_sum`), its pod watches open at the churn's middle
//!    (`apiserver_longrunning_requests`), and each above the unwatched churn; the
//!    configurations alternate within each of R rounds (3), and the median round is reported.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchParams};
use podstream_tests::control_plane::{ControlPlane, Options};
use podstream_tests::nats::NatsServer;
use podstream_tests::{free_port, http_get, podstream_binary};
use serde_json::json;

/// The scheduler job ids the standing pods belong to.
const OWNERS: u32 = 4;
/// Requests of the churn in flight at once.
const IN_FLIGHT: usize = 16;
const NAMESPACE: &str = "airflow";

/// Who watches the worker pods during a churn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watchers {
    /// Nobody: the churn's own cost.
    None,
    /// `n` stock schedulers, each its own label-scoped list and watch.
    Stock(u32),
    /// Two podstream ingests, one leading.
    Podstream,
}

impl Watchers {
    fn name(self) -> String {
        match self {
            Watchers::None => "nobody watches".into(),
            Watchers::Stock(n) => format!("{n} stock scheduler(s)"),
            Watchers::Podstream => "podstream ingest (HA pair)".into(),
        }
    }
}

/// What one configuration cost the API server.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    cpu_seconds: f64,
    events: f64,
    bytes: f64,
    list_bytes: f64,
    watches: f64,
    seconds: f64,
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (standing, churned, rounds) = if bench {
        (
            podstream_tests::bench_option("--standing", 10_000),
            podstream_tests::bench_option("--churned", 2_000),
            podstream_tests::bench_option("--rounds", 3),
        )
    } else {
        (40, 20, 1)
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(run(standing, churned, rounds));
}

async fn run(standing: usize, churned: usize, rounds: usize) {
    let plane = ControlPlane::start(Options::default());
    plane.create_namespace(NAMESPACE);
    let nats = NatsServer::start();
    let client = client(plane.admin_kubeconfig()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);

    let started = Instant::now();
    stream::iter(0..standing)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let name = format!("standing-{i}");
                pods.create(&PostParams::default(), &worker_pod(&name, i))
                    .await
                    .unwrap();
                set_phase(&pods, &name, "Running").await;
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    println!(
        "{standing} standing pods Running in {:.1} s; each configuration churns {churned} more",
        started.elapsed().as_secs_f64()
    );

    let configurations = [
        Watchers::None,
        Watchers::Stock(1),
        Watchers::Stock(2),
        Watchers::Stock(4),
        Watchers::Podstream,
    ];
    let mut measured: Vec<Vec<Cost>> = vec![Vec::new(); configurations.len()];
    for round in 0..rounds {
        for (index, watchers) in configurations.into_iter().enumerate() {
            let label = round * configurations.len() + index;
            let cost = measure(&plane, &client, &nats, watchers, label, churned).await;
            println!(
                "round {round}: {:<28} {:>7.2} CPU s  {:>7.0} watch events  {:>9.1} KB watched  {:>9.1} KB listed  {:>3.0} pod watches  ({:.1} s)",
                watchers.name(),
                cost.cpu_seconds,
                cost.events,
                cost.bytes / 1024.0,
                cost.list_bytes / 1024.0,
                cost.watches,
                cost.seconds
            );
            measured[index].push(cost);
        }
    }
    // Each configuration's round of median CPU.
    let costs: Vec<(Watchers, Cost)> = configurations
        .into_iter()
        .zip(measured)
        .map(|(watchers, mut rounds)| {
            rounds.sort_by(|a, b| a.cpu_seconds.total_cmp(&b.cpu_seconds));
            (watchers, rounds[rounds.len() / 2])
        })
        .collect();

    let base = costs[0].1;
    let podstream = costs.last().unwrap().1;
    let above = |cost: Cost| Cost {
        cpu_seconds: cost.cpu_seconds - base.cpu_seconds,
        events: cost.events - base.events,
        bytes: cost.bytes - base.bytes,
        list_bytes: cost.list_bytes - base.list_bytes,
        ..cost
    };
    println!("\nabove the unwatched churn, podstream beside N stock schedulers:");
    for (watchers, cost) in &costs[1..costs.len() - 1] {
        let (stock, ours) = (above(*cost), above(podstream));
        let (stock_sent, ours_sent) =
            (stock.bytes + stock.list_bytes, ours.bytes + ours.list_bytes);
        println!(
            "{:<22} CPU {:>6.2} s vs {:>6.2} s = {:.2}x   bytes sent {:>9.1} KB vs {:>9.1} KB = {:.2}x   watches {:.0} vs {:.0}",
            watchers.name(),
            stock.cpu_seconds,
            ours.cpu_seconds,
            ratio(ours.cpu_seconds, stock.cpu_seconds),
            stock_sent / 1024.0,
            ours_sent / 1024.0,
            ratio(ours_sent, stock_sent),
            stock.watches,
            ours.watches,
        );
    }
    // The smoke run checks that each configuration was seen watching.
    for (watchers, cost) in &costs {
        match watchers {
            Watchers::None => {}
            _ => assert!(
                cost.events > 0.0,
                "{}: no watch event sent",
                watchers.name()
            ),
        }
    }
}

/// `ours / theirs`, or NaN when theirs is not above zero.
fn ratio(ours: f64, theirs: f64) -> f64 {
    if theirs > 0.0 {
        ours / theirs
    } else {
        f64::NAN
    }
}

/// One churn of `churned` pods under `watchers`, measured from the watchers' start until a
/// second after the churn.
async fn measure(
    plane: &ControlPlane,
    admin: &kube::Client,
    nats: &NatsServer,
    watchers: Watchers,
    round: usize,
    churned: usize,
) -> Cost {
    let before = apiserver_metrics(admin).await;
    let cpu_before = cpu_seconds(plane.apiserver_pid());
    let started = Instant::now();

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let mut ingests = Vec::new();
    match watchers {
        Watchers::None => {}
        Watchers::Stock(n) => {
            for scheduler in 0..n {
                let client = client(plane.admin_kubeconfig()).await;
                let stopped = stopped.clone();
                let owned: Vec<u32> = (0..OWNERS).filter(|id| id % n == scheduler).collect();
                tasks.push(tokio::spawn(stock_watch(client, owned, stopped)));
            }
        }
        Watchers::Podstream => {
            // A fresh deployment each round: under a prefix of its own it finds no checkpoint
            // to catch up from (the stock watchers start from resourceVersion 0 too).
            let prefix = format!("bench{round}");
            for replica in 0..2 {
                ingests.push(Ingest::start(
                    plane.admin_kubeconfig(),
                    nats,
                    &prefix,
                    replica,
                ));
            }
            for ingest in &mut ingests {
                ingest.until_ready();
            }
        }
    }

    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let half = churned / 2;
    let mut watches = 0.0;
    for (from, to) in [(0, half), (half, churned)] {
        stream::iter(from..to)
            .map(|i| {
                let pods = pods.clone();
                async move {
                    let name = format!("churn-{round}-{i}");
                    pods.create(&PostParams::default(), &worker_pod(&name, i))
                        .await
                        .unwrap();
                    set_phase(&pods, &name, "Running").await;
                    set_phase(&pods, &name, "Succeeded").await;
                    pods.delete(&name, &DeleteParams::default()).await.unwrap();
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
        if from == 0 {
            watches = apiserver_metrics(admin).await.watches;
        }
    }
    // The last events reach their watchers; measured before any watcher stops (a stopping
    // leader hands its Lease to the standby, which would list and watch again).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(plane.apiserver_pid()) - cpu_before;
    let after = apiserver_metrics(admin).await;
    stop.send_replace(true);
    for task in tasks {
        task.await.unwrap();
    }
    for mut ingest in ingests {
        ingest.stop();
    }
    Cost {
        cpu_seconds: cpu,
        events: after.events - before.events,
        bytes: after.bytes - before.bytes,
        list_bytes: after.list_bytes - before.list_bytes,
        watches,
        seconds,
    }
}

/// A stock scheduler's watcher: the pods of the job ids it owns watched by label from
/// resourceVersion 0 (all of them first, as ADDED events), until `stopped`.
async fn stock_watch(
    client: kube::Client,
    owned: Vec<u32>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let owner = match owned.as_slice() {
        [one] => format!("airflow-worker={one}"),
        many => format!(
            "airflow-worker in ({})",
            many.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    };
    let selector = format!("{owner},airflow_executor_done!=True");
    let watch = WatchParams::default().labels(&selector).timeout(3600);
    let mut events = pods.watch(&watch, "0").await.unwrap().boxed();
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            event = events.try_next() => match event {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            },
        }
    }
}

/// A `podstream ingest` replica with leader election, as the shipped Deployment runs it.
struct Ingest {
    child: Child,
    ops: std::net::SocketAddr,
}

impl Ingest {
    fn start(kubeconfig: &Path, nats: &NatsServer, prefix: &str, replica: usize) -> Ingest {
        let ops = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
        let child = Command::new(podstream_binary())
            .args(["ingest", "--nats", &nats.url(), "--prefix", prefix])
            .args(["--namespaces", NAMESPACE, "--lease-namespace", NAMESPACE])
            .args(["--metrics-listen", &ops.to_string()])
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", format!("ingest-{replica}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Ingest { child, ops }
    }

    /// Until it answers `/healthz` (the standby is alive but not ready: it does not watch).
    fn until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get(self.ops, "/healthz").is_none_or(|(status, _)| status != 200) {
            assert!(Instant::now() < deadline, "the ingest did not start");
            assert!(self.child.try_wait().unwrap().is_none(), "the ingest ended");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        nix_term(self.child.id());
        let _ = self.child.wait();
    }
}

fn nix_term(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// A worker pod as the KubernetesExecutor labels it, owned by scheduler job `i % OWNERS`.
fn worker_pod(name: &str, i: usize) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes_executor": "True",
                "airflow-worker": (i % OWNERS as usize).to_string(),
                "dag_id": "etl",
                "task_id": format!("t{i}"),
                "run_id": "scheduled__2026-12-07T0000000000-0bb1b2fa1",
                "try_number": "1",
            },
            "annotations": {
                "dag_id": "etl",
                "task_id": format!("t{i}"),
                "run_id": "scheduled__2026-12-07T00:00:00+00:00",
                "try_number": "1",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{ "name": "base", "image": "apache/airflow:3.1.8",
                "args": ["airflow", "tasks", "run", "etl", format!("t{i}")] }],
        },
    }))
    .unwrap()
}

/// The pod's phase, as its kubelet would write it.
async fn set_phase(pods: &Api<Pod>, name: &str, phase: &str) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "phase": phase } })),
    )
    .await
    .unwrap();
}

async fn client(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The process's user and system CPU seconds so far.
fn cpu_seconds(pid: u32) -> f64 {
    podstream_tests::ProcessCpu::of(pid)
        .unwrap_or_else(|| panic!("process {pid} is gone"))
        .own
}

/// The API server's own counts for pods: watch events sent, their bytes, watches open.
#[derive(Debug, Default)]
struct Metrics {
    events: f64,
    bytes: f64,
    list_bytes: f64,
    watches: f64,
}

async fn apiserver_metrics(admin: &kube::Client) -> Metrics {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(request).await.unwrap();
    let mut metrics = Metrics::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        let pods = series.contains("kind=\"Pod\"") || series.contains("resource=\"pods\"");
        if !pods {
            continue;
        }
        if series.starts_with("apiserver_watch_events_total{") {
            metrics.events += value;
        } else if series.starts_with("apiserver_watch_events_sizes_sum{") {
            metrics.bytes += value;
        } else if series.starts_with("apiserver_response_sizes_sum{")
            && series.contains("verb=\"LIST\"")
        {
            metrics.list_bytes += value;
        } else if series.starts_with("apiserver_longrunning_requests{")
            && series.contains("verb=\"WATCH\"")
        {
            metrics.watches += value;
        }
    }
    metrics
}

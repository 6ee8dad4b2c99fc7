//! How fast the simulator fans pod updates out to watchers, and what a retained event costs.
//!
//! `cargo bench -p podstream-sim --bench fanout` prints, in one run:
//! - the store alone: updates/s through the control API with no watcher (the baseline);
//! - the same updates streamed to 4 HTTP watchers, counted when the last watcher has them all;
//! - memory per retained event: resident-set growth while the change log fills, per event.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, StreamExt};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use podstream_sim::{Server, SimConfig, WorkerPod};

const WATCHERS: usize = 4;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn start(retain: usize, pods: usize) -> Server {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(
        addr,
        SimConfig {
            retain_events: retain,
            namespaces: vec!["airflow".into()],
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    for i in 0..pods {
        let name = format!("pod-{i:05}");
        let pod = WorkerPod::new(
            &name,
            "1",
            "etl",
            &name,
            "scheduled__2026-11-30T10:00:00+00:00",
        );
        server.cluster().create_pod(pod.to_json()).unwrap();
    }
    server
}

/// `updates` changes spread over the pods, as the kubelet and controllers would make them.
fn churn(server: &Server, pods: usize, updates: usize) {
    for n in 0..updates {
        let name = format!("pod-{:05}", n % pods);
        server
            .cluster()
            .modify_pod("airflow", &name, |pod| {
                pod["metadata"]["annotations"]["beat"] = serde_json::json!(n.to_string());
            })
            .unwrap();
    }
}

async fn baseline(pods: usize, updates: usize) -> f64 {
    let server = start(updates + pods + 16, pods).await;
    let started = Instant::now();
    churn(&server, pods, updates);
    updates as f64 / started.elapsed().as_secs_f64()
}

async fn fanout(pods: usize, updates: usize) -> f64 {
    let server = start(updates + pods + 16, pods).await;
    let kubeconfig = Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    let from = server.cluster().resource_version();
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let request = http::Request::get(format!(
            "/api/v1/namespaces/airflow/pods?watch=true&resourceVersion={from}"
        ))
        .body(Vec::new())
        .unwrap();
        let mut lines = Box::pin(client.request_stream(request).await.unwrap().lines());
        watchers.push(tokio::spawn(async move {
            let mut seen = 0;
            while seen < updates {
                match lines.next().await {
                    Some(Ok(_)) => seen += 1,
                    _ => break,
                }
            }
            seen
        }));
    }
    let started = Instant::now();
    let driver = tokio::task::spawn_blocking(move || {
        churn(&server, pods, updates);
        server
    });
    let _server = driver.await.unwrap();
    for watcher in watchers {
        assert_eq!(watcher.await.unwrap(), updates, "a watcher missed events");
    }
    updates as f64 / started.elapsed().as_secs_f64()
}

async fn memory_per_event(pods: usize, events: usize) -> (f64, f64) {
    let server = start(events + pods + 16, pods).await;
    let before = rss_bytes();
    churn(&server, pods, events);
    let after = rss_bytes();
    let json = server
        .cluster()
        .pod("airflow", "pod-00000")
        .unwrap()
        .to_string()
        .len();
    assert!(server.cluster().retained_events() >= events);
    (
        (after.saturating_sub(before)) as f64 / events as f64,
        json as f64,
    )
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (pods, updates, runs) = if full {
        (1_000, 100_000, 3)
    } else {
        (50, 500, 1)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for run in 1..=runs {
            let store = baseline(pods, updates).await;
            let streamed = fanout(pods, updates).await;
            println!(
                "run {run}: store alone {store:>9.0} updates/s | to {WATCHERS} watchers {streamed:>9.0} updates/s | ratio {:.2}",
                streamed / store
            );
        }
        let (per_event, json) = memory_per_event(pods, if full { 200_000 } else { 1_000 }).await;
        println!("memory per retained event: {per_event:.0} bytes (pod JSON {json:.0} bytes)");
        tokio::time::sleep(Duration::from_millis(10)).await;
    });
}

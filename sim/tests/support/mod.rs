//! What the simulator's client suites share: a server on a free port and a kube client for it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use podstream_sim::{Server, SimConfig, WorkerPod};

/// A simulator on a free local port, with a short bookmark interval.
pub async fn server() -> Server {
    server_with(SimConfig {
        bookmark_interval: Duration::from_millis(200),
        namespaces: vec!["airflow".into()],
        ..SimConfig::default()
    })
    .await
}

/// A simulator with the given configuration.
pub async fn server_with(config: SimConfig) -> Server {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Server::start(addr, config).await.unwrap()
}

/// A kube client configured from the kubeconfig the simulator writes, as a user's would be.
pub async fn client(server: &Server) -> Client {
    let kubeconfig = Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// An Airflow worker pod owned by scheduler `owner`, in namespace `airflow`.
pub fn worker(name: &str, owner: &str) -> serde_json::Value {
    WorkerPod::new(
        name,
        owner,
        "etl",
        name,
        "scheduled__2026-11-30T10:00:00+00:00",
    )
    .to_json()
}

/// The next item of a stream, or a panic after 10 s.
pub async fn next<S: Stream + Unpin>(stream: &mut S) -> S::Item {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("timed out waiting for the next watch item")
        .expect("stream ended")
}

/// A pod's `airflow-worker` label.
pub fn owner(pod: &Pod) -> Option<String> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("airflow-worker"))
        .cloned()
}

/// A pod's name.
pub fn name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

//! Many watchers under churn: 100 watch connections, 10k pods created, changed and deleted
//! from four threads at once. Every watcher must see every change, once, in revision order.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt};
use podstream_sim::{Deletion, SimConfig};
use serde::Deserialize;
use support::{client, server_with, worker};

const WATCHERS: usize = 100;
const PODS: usize = 10_000;
const DRIVERS: usize = 4;

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    object: Object<'a>,
}

#[derive(Deserialize)]
struct Object<'a> {
    #[serde(borrow)]
    metadata: Metadata<'a>,
}

#[derive(Deserialize)]
struct Metadata<'a> {
    #[serde(borrow)]
    name: &'a str,
    #[serde(rename = "resourceVersion")]
    resource_version: &'a str,
}

fn rv_of(value: &serde_json::Value) -> u64 {
    value["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_watchers_see_every_change_of_ten_thousand_pods_in_order() {
    let sim = server_with(SimConfig {
        retain_events: 100_000,
        namespaces: vec!["airflow".into()],
        ..SimConfig::default()
    })
    .await;
    let client = client(&sim).await;
    let start = sim.cluster().resource_version();

    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let client = client.clone();
        let request = http::Request::get(format!(
            "/api/v1/namespaces/airflow/pods?watch=true&resourceVersion={start}"
        ))
        .body(Vec::new())
        .unwrap();
        let mut lines = Box::pin(client.request_stream(request).await.unwrap().lines());
        watchers.push(tokio::spawn(async move {
            let mut seen: Vec<(u64, String)> = Vec::new();
            while let Some(line) = lines.next().await {
                let line = line.unwrap();
                let event: Line = serde_json::from_str(&line).unwrap();
                let rv: u64 = event.object.metadata.resource_version.parse().unwrap();
                if event.object.metadata.name == "the-end" {
                    break;
                }
                seen.push((rv, event.kind.to_owned()));
            }
            seen
        }));
    }

    // Four "kubelets" churn their share of the pods at once; each records what it did.
    let drivers: Vec<_> = (0..DRIVERS)
        .map(|driver| {
            let cluster = sim.cluster().clone();
            std::thread::spawn(move || {
                let mut done = Vec::new();
                let names: Vec<String> = (driver..PODS)
                    .step_by(DRIVERS)
                    .map(|i| format!("pod-{i:05}"))
                    .collect();
                for chunk in names.chunks(50) {
                    for name in chunk {
                        done.push((
                            rv_of(&cluster.create_pod(worker(name, "1")).unwrap()),
                            "ADDED".to_owned(),
                        ));
                    }
                    for name in chunk {
                        done.push((
                            rv_of(&cluster.set_phase("airflow", name, "Running").unwrap()),
                            "MODIFIED".to_owned(),
                        ));
                    }
                    for name in chunk {
                        let relabelled = cluster
                            .relabel("airflow", name, "airflow-worker", Some("2"))
                            .unwrap();
                        done.push((rv_of(&relabelled), "MODIFIED".to_owned()));
                    }
                    for name in chunk {
                        let Deletion::Gone(last) =
                            cluster.delete_pod("airflow", name, Some(0)).unwrap()
                        else {
                            panic!("grace 0 deletes at once");
                        };
                        done.push((last.resource_version, "DELETED".to_owned()));
                    }
                }
                done
            })
        })
        .collect();
    let mut expected: Vec<(u64, String)> = drivers
        .into_iter()
        .flat_map(|d| d.join().unwrap())
        .collect();
    expected.sort();
    assert_eq!(expected.len(), PODS * 4);
    sim.cluster().create_pod(worker("the-end", "1")).unwrap();

    for (i, watcher) in watchers.into_iter().enumerate() {
        let seen = tokio::time::timeout(Duration::from_secs(120), watcher)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            seen.len(),
            expected.len(),
            "watcher {i} saw {} events",
            seen.len()
        );
        assert!(
            seen == expected,
            "watcher {i} saw the changes out of order or altered"
        );
    }
}

//! Throughput of `decide` over 100k generated worker-pod events (mixed
//! phases, ~10% relabels, ~1% duplicate pods), side by side with baselines:
//!
//! - `core`: `Processor::handle` over ready `PodEvent`s;
//! - `core_wire_commands`: the same, each command then made a wire `Command`
//!   (what the service and `decide` do at their edge);
//! - `core_clone_baseline`: cloning the same events, the floor of touching them;
//! - `json_projection_core`: read each JSON line as `podstream decide` does
//!   (only the fields the projection needs), project, decide;
//! - `json_parse_baseline`: `serde_json` parsing of the same lines alone.
//!
//! Run: `cargo bench -p podstream-rules --bench decide`. Figures go to
//! BENCHMARKS.md as events/s and as ratios to the baselines.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use podstream_ingest::pod_json::project_watch_event;
use podstream_ingest::project;
use podstream_ingest::watch_json::{WatchItem, read_json};
use podstream_proto::PodEvent;
use podstream_rules::{MemoryStore, Processor, Rules};
use serde_json::{Value, json};

/// The allocator the `podstream` binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const EVENTS: usize = 100_000;

/// A small deterministic generator, so every run decides the same stream.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn pod_json(uid: usize, ti: usize, owner: u64, phase: &str, rv: usize, deleting: bool) -> Value {
    let state = match phase {
        "Running" => json!({"running": {"startedAt": "2026-11-30T10:00:05Z"}}),
        "Succeeded" => json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
        "Failed" => json!({"terminated": {"exitCode": 1, "reason": "Error"}}),
        _ => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("etl-task-{ti}-{uid}"), "namespace": "airflow", "uid": format!("uid-{uid:08}"),
            "resourceVersion": rv.to_string(), "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {"airflow-worker": owner.to_string(), "dag_id": "etl", "task_id": format!("task_{ti}"),
                       "run_id": "scheduled__2026-11-30T1000000000-9f8e7d6c5", "try_number": "1",
                       "kubernetes_executor": "True", "airflow_version": "2.10.5"},
            "annotations": {"dag_id": "etl", "task_id": format!("task_{ti}"),
                            "run_id": "scheduled__2026-11-30T10:00:00+00:00", "try_number": "1"}
        },
        "spec": {"containers": [{"name": "base", "image": "apache/airflow:2.10.5",
                                 "args": ["airflow", "tasks", "run", "etl", format!("task_{ti}")]}],
                 "restartPolicy": "Never"},
        "status": {"phase": phase, "containerStatuses": [
            {"name": "base", "image": "apache/airflow:2.10.5", "imageID": "", "ready": phase == "Running",
             "restartCount": 0, "state": state}]}
    });
    if deleting {
        pod["metadata"]["deletionTimestamp"] = json!("2026-11-30T10:30:00Z");
    }
    pod
}

/// 100k watch events as JSON lines: pods go Pending → Running → Succeeded or
/// Failed (some deleted after), ~10% are relabelled mid-run, ~1% of task
/// instances get a second pod.
fn generate() -> Vec<String> {
    let mut rng = Lcg(42);
    let mut lines = Vec::with_capacity(EVENTS);
    let mut rv = 1000;
    let mut uid = 0;
    let mut ti = 0;
    while lines.len() < EVENTS {
        ti += 1;
        let pods = if rng.below(100) == 0 { 2 } else { 1 };
        for _ in 0..pods {
            uid += 1;
            let mut owner = 1 + rng.below(4);
            let mut push = |kind: &str, phase: &str, owner: u64, deleting: bool| {
                rv += 1;
                let event =
                    json!({"type": kind, "object": pod_json(uid, ti, owner, phase, rv, deleting)});
                lines.push(event.to_string());
            };
            push("ADDED", "Pending", owner, false);
            push("MODIFIED", "Running", owner, false);
            if rng.below(10) == 0 {
                owner = owner % 4 + 1;
                push("MODIFIED", "Running", owner, false);
            }
            let end = if rng.below(5) == 0 {
                "Failed"
            } else {
                "Succeeded"
            };
            push("MODIFIED", end, owner, false);
            if rng.below(2) == 0 {
                push("DELETED", end, owner, true);
            }
        }
    }
    lines.truncate(EVENTS);
    lines
}

/// As `podstream decide` reads a line: the lean path, else the generic one.
fn project_line(line: &str) -> Option<PodEvent> {
    if let Some(projected) = project_watch_event(line) {
        return projected.ok();
    }
    match read_json(line).pop()? {
        WatchItem::Pod { event_type, pod } => project(event_type, &pod).ok(),
        _ => None,
    }
}

fn bench(c: &mut Criterion) {
    let lines = generate();
    let events: Vec<PodEvent> = lines.iter().filter_map(|l| project_line(l)).collect();
    assert_eq!(events.len(), EVENTS, "every generated event projects");

    let mut group = c.benchmark_group("decide_100k");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.sample_size(10);

    group.bench_function("core", |b| {
        b.iter(|| {
            let mut processor = Processor::new(Rules::default(), MemoryStore::default());
            let mut commands = 0;
            for event in &events {
                commands += processor.handle(event).map_or(0, |c| c.len());
            }
            black_box(commands)
        })
    });
    // What the pipeline's edge adds: every decided command made a wire `Command`.
    group.bench_function("core_wire_commands", |b| {
        b.iter(|| {
            let mut processor = Processor::new(Rules::default(), MemoryStore::default());
            let mut commands = 0;
            for event in &events {
                for command in processor.handle(event).into_iter().flatten() {
                    commands += black_box(command.into_command()).id.len();
                }
            }
            black_box(commands)
        })
    });
    group.bench_function("core_clone_baseline", |b| {
        b.iter(|| {
            let mut n = 0;
            for event in &events {
                n += black_box(event.clone()).resource_version.len();
            }
            black_box(n)
        })
    });
    group.bench_function("json_projection_core", |b| {
        b.iter(|| {
            let mut processor = Processor::new(Rules::default(), MemoryStore::default());
            let mut commands = 0;
            for line in &lines {
                if let Some(event) = project_line(line) {
                    commands += processor.handle(&event).map_or(0, |c| c.len());
                }
            }
            black_box(commands)
        })
    });
    group.bench_function("json_parse_baseline", |b| {
        b.iter(|| {
            let mut n = 0;
            for line in &lines {
                n += serde_json::from_str::<Value>(line)
                    .map_or(0, |v| v.as_object().map_or(0, |o| o.len()));
            }
            black_box(n)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! `podstream decide` (release build, its own process) beside Airflow's own watcher code, over
//! the same file of Airflow-shaped pod watch events, in one run.
//!
//! `cargo bench -p podstream-tests --bench decide_vs_airflow`:
//! 1. 50,000 watch events (~1 KB each: worker pods going Pending → Running → Succeeded or
//!    Failed, some relabelled, some deleted, a few TIs with a second pod) into a file;
//! 2. Airflow's watcher code (`airflow_watcher.py`, in the newest Airflow venv): the Python
//!    client's deserialization and `KubernetesJobWatcher.process_status` per event, imports and
//!    file reading outside its clock;
//! 3. `podstream decide FILE > FILE.out` on the same events in each JSON form users feed it
//!    (compact, Python's default `json.dumps`, kubectl's pretty print), wall clock and peak
//!    resident memory (of the process alone: a wrapper process, this bench's own binary,
//!    waits for it and reads its rusage); every form must decide to the same output;
//! 4. the ratio per form, and `decide`'s peak resident memory over 200,000 events;
//! 5. the floor under any reader of each form: serde_json reading the file's values into
//!    nothing (`IgnoredAny`), one thread, in this process, the file read included;
//! 6. per form, one thread, in this process, the text in memory: serde_json and sonic-rs
//!    (SIMD) reading every value into nothing (`IgnoredAny`, the floor under any reader of
//!    that library), sonic-rs locating the raw text of each field `decide` reads (`get_many`,
//!    checked), and `decide`'s own reader projecting each event to its `PodEvent`.
//!
//! Rounds alternate between the two, so a slow moment of the machine hits both.
//! `... --bench decide_vs_airflow -- --write-events FILE N` only writes N such events. Without
//! `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use nix::sys::resource::{UsageWho, getrusage};
use podstream_tests::JsonForm;
use podstream_tests::airflow::Airflow;
use serde_json::{Value, json};

/// The wrapper's first argument: run the rest as a child, report its time and peak memory.
const MEASURE_CHILD: &str = "--measure-child";
/// `--write-events FILE N`: only write the events, to decide them by hand.
const WRITE_EVENTS: &str = "--write-events";

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

/// A worker pod as the KubernetesExecutor makes it and the API server reports it.
fn pod(uid: usize, ti: usize, owner: u64, phase: &str, rv: usize, deleting: bool) -> Value {
    let task = format!("transform_{ti:06}");
    let state = match phase {
        "Running" => json!({"running": {"startedAt": "2026-11-30T10:00:05Z"}}),
        "Succeeded" => json!({"terminated": {"exitCode": 0, "reason": "Completed",
            "startedAt": "2026-11-30T10:00:05Z", "finishedAt": "2026-11-30T10:04:12Z"}}),
        "Failed" => json!({"terminated": {"exitCode": 1, "reason": "Error",
            "startedAt": "2026-11-30T10:00:05Z", "finishedAt": "2026-11-30T10:04:12Z"}}),
        _ => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("nightly-etl-{task}-{uid:08x}"),
            "namespace": "airflow",
            "uid": format!("6f1c2b4e-0d3a-4c55-9e7a-{uid:012x}"),
            "resourceVersion": rv.to_string(),
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {
                "airflow-worker": owner.to_string(), "airflow_version": "3.1.8",
                "dag_id": "nightly_etl", "task_id": task,
                "run_id": "scheduled__2026-11-30T1000000000-2c9f1e07a", "try_number": "1",
                "kubernetes_executor": "True",
            },
            "annotations": {
                "dag_id": "nightly_etl", "task_id": task,
                "run_id": "scheduled__2026-11-30T10:00:00+00:00", "try_number": "1",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": "airflow-worker",
            "nodeName": format!("worker-node-{}", uid % 7),
            "containers": [{
                "name": "base",
                "image": "apache/airflow:3.1.8",
                "args": ["airflow", "tasks", "run", "nightly_etl", task,
                         "scheduled__2026-11-30T10:00:00+00:00", "--local"],
                "env": [{"name": "AIRFLOW_IS_K8S_EXECUTOR_POD", "value": "True"}],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            }],
        },
        "status": {
            "phase": phase,
            "hostIP": "10.0.3.17",
            "podIP": format!("10.244.{}.{}", uid % 200, uid % 250),
            "startTime": "2026-11-30T10:00:01Z",
            "containerStatuses": [{
                "name": "base", "image": "apache/airflow:3.1.8", "imageID": "",
                "ready": phase == "Running", "restartCount": 0, "state": state,
            }],
        },
    });
    if deleting {
        pod["metadata"]["deletionTimestamp"] = json!("2026-11-30T10:30:00Z");
    }
    pod
}

/// `count` watch events as lines of `path`; returns their mean size in bytes.
fn write_events(path: &Path, count: usize) -> usize {
    let mut out = BufWriter::new(File::create(path).unwrap());
    let mut rng = Lcg(42);
    let (mut written, mut bytes, mut rv, mut uid, mut ti) = (0, 0, 1000, 0, 0);
    while written < count {
        ti += 1;
        let pods = if rng.below(100) == 0 { 2 } else { 1 };
        for _ in 0..pods {
            uid += 1;
            let mut owner = 1 + rng.below(3);
            let mut steps = vec![("ADDED", "Pending", owner, false)];
            steps.push(("MODIFIED", "Pending", owner, false));
            steps.push(("MODIFIED", "Running", owner, false));
            if rng.below(20) == 0 {
                owner = owner % 3 + 1;
                steps.push(("MODIFIED", "Running", owner, false));
            }
            let end = if rng.below(5) == 0 {
                "Failed"
            } else {
                "Succeeded"
            };
            steps.push(("MODIFIED", end, owner, false));
            if rng.below(2) == 0 {
                steps.push(("MODIFIED", end, owner, true));
                steps.push(("DELETED", end, owner, true));
            }
            for (kind, phase, owner, deleting) in steps {
                if written == count {
                    break;
                }
                rv += 1;
                let line =
                    json!({"type": kind, "object": pod(uid, ti, owner, phase, rv, deleting)})
                        .to_string();
                bytes += line.len() + 1;
                writeln!(out, "{line}").unwrap();
                written += 1;
            }
        }
    }
    out.flush().unwrap();
    bytes / count.max(1)
}

/// One timed run of a process.
struct Run {
    seconds: f64,
    peak_rss_mb: f64,
}

/// Runs `podstream decide events` through the wrapper; returns its time, its peak memory and
/// the number of lines it wrote.
fn decide(binary: &Path, events: &Path) -> (Run, usize) {
    let out_path = events.with_extension("out");
    let output = Command::new(std::env::current_exe().unwrap())
        .arg(MEASURE_CHILD)
        .arg(&out_path)
        .arg(binary)
        .arg("decide")
        .arg(events)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "decide failed: {output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let lines = BufReader::new(File::open(&out_path).unwrap()).lines();
    let mut commands = 0;
    for line in lines {
        let line = line.unwrap();
        assert!(
            !line.contains("\"invalid\""),
            "decide found an invalid event: {line}"
        );
        commands += 1;
    }
    let run = Run {
        seconds: report["seconds"].as_f64().unwrap(),
        peak_rss_mb: report["peak_rss_kb"].as_f64().unwrap() / 1024.0,
    };
    (run, commands)
}

/// The wrapper: runs `program args...` with its standard output to `out`, prints the seconds
/// it took and its peak resident memory (this process has no other child).
fn measure_child(out: &str, program: &str, args: &[String]) {
    let start = Instant::now();
    let status = Command::new(program)
        .args(args)
        .stdout(File::create(out).unwrap())
        .stderr(Stdio::inherit())
        .env("RUST_LOG", "warn")
        .status()
        .unwrap();
    let seconds = start.elapsed().as_secs_f64();
    assert!(status.success(), "{program} failed: {status}");
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap();
    // Linux reports ru_maxrss in KiB.
    println!(
        "{}",
        json!({"seconds": seconds, "peak_rss_kb": usage.max_rss()})
    );
}

/// Airflow's watcher code over `events`, in the venv of `airflow`.
fn airflow_watcher(airflow: Airflow, home: &Path, events: &Path) -> (Run, Value) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/airflow_watcher.py");
    let output = airflow
        .python(home)
        .arg(script)
        .arg(events)
        .env("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the Airflow watcher failed: {output:?}"
    );
    // Airflow may print notices first; the report is the last line.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the Airflow watcher's report {last:?}: {e}"));
    let run = Run {
        seconds: report["seconds"].as_f64().unwrap(),
        peak_rss_mb: 0.0,
    };
    (run, report)
}

/// Events a second of each reader of one form's text, one thread, the text in memory.
#[derive(Debug, Clone, Copy)]
struct Readers {
    /// serde_json reading every value into nothing (`IgnoredAny`): the floor under any
    /// serde_json reader.
    serde_json: f64,
    /// sonic-rs (SIMD) reading every value into nothing.
    sonic_rs: f64,
    /// sonic-rs locating the raw text of each field `decide` reads (`get_many`, checked): the
    /// floor under a projection built on it.
    sonic_fields: f64,
    /// `decide`'s own reader: each event projected to its `PodEvent` (`pod_json`).
    projection: f64,
}

impl Readers {
    fn describe(&self, airflow_rate: f64) -> String {
        format!(
            "in memory, one thread: serde_json reading it alone {:.0} events/s ({:.1}x), \
             sonic-rs reading it alone {:.0} ({:.1}x), sonic-rs locating decide's fields {:.0} \
             ({:.1}x), decide's projection {:.0} ({:.1}x)",
            self.serde_json,
            self.serde_json / airflow_rate,
            self.sonic_rs,
            self.sonic_rs / airflow_rate,
            self.sonic_fields,
            self.sonic_fields / airflow_rate,
            self.projection,
            self.projection / airflow_rate,
        )
    }
}

/// The paths of what `decide` reads in a watch event (`ingest/src/pod_json.rs`).
const DECIDE_PATHS: &[&[&str]] = &[
    &["type"],
    &["object", "apiVersion"],
    &["object", "kind"],
    &["object", "metadata", "uid"],
    &["object", "metadata", "namespace"],
    &["object", "metadata", "name"],
    &["object", "metadata", "resourceVersion"],
    &["object", "metadata", "creationTimestamp"],
    &["object", "metadata", "deletionTimestamp"],
    &["object", "metadata", "labels"],
    &["object", "metadata", "annotations"],
    &["object", "spec", "containers"],
    &["object", "status", "phase"],
    &["object", "status", "reason"],
    &["object", "status", "initContainerStatuses"],
    &["object", "status", "containerStatuses"],
];

/// serde_json reading `path`'s values into nothing, one thread, the file read included: the
/// floor under any reader of that form, whatever it then does.
fn read_only_rate(path: &Path, events: usize) -> f64 {
    let start = Instant::now();
    let bytes = std::fs::read(path).unwrap();
    let values = serde_json::Deserializer::from_slice(&bytes)
        .into_iter::<serde::de::IgnoredAny>()
        .map(Result::unwrap)
        .count();
    assert_eq!(values, events, "{} holds every event", path.display());
    events as f64 / start.elapsed().as_secs_f64()
}

fn readers(path: &Path, events: usize) -> Readers {
    let bytes = std::fs::read(path).unwrap();
    // Each event's text, framed before any clock starts.
    let mut values =
        serde_json::Deserializer::from_slice(&bytes).into_iter::<serde::de::IgnoredAny>();
    let mut texts = Vec::with_capacity(events);
    let mut from = 0;
    while let Some(value) = values.next() {
        value.unwrap();
        let to = values.byte_offset();
        texts.push(std::str::from_utf8(&bytes[from..to]).unwrap().trim());
        from = to;
    }
    assert_eq!(texts.len(), events, "{} holds every event", path.display());
    let rate = |read: &dyn Fn() -> usize| {
        let start = Instant::now();
        assert_eq!(
            read(),
            events,
            "a reader read every event of {}",
            path.display()
        );
        events as f64 / start.elapsed().as_secs_f64()
    };
    let mut tree = sonic_rs::PointerTree::new();
    for path in DECIDE_PATHS {
        tree.add_path(path.iter());
    }
    Readers {
        serde_json: rate(&|| {
            serde_json::Deserializer::from_slice(&bytes)
                .into_iter::<serde::de::IgnoredAny>()
                .map(Result::unwrap)
                .count()
        }),
        sonic_rs: rate(&|| {
            sonic_rs::Deserializer::from_slice(&bytes)
                .into_stream::<serde::de::IgnoredAny>()
                .map(Result::unwrap)
                .count()
        }),
        sonic_fields: rate(&|| {
            texts
                .iter()
                .filter(|text| {
                    let fields = sonic_rs::get_many(**text, &tree).unwrap();
                    fields.iter().take(3).all(Option::is_some)
                })
                .count()
        }),
        projection: rate(&|| {
            texts
                .iter()
                .filter(|text| {
                    matches!(
                        podstream_ingest::pod_json::project_watch_event(text),
                        Some(Ok(_))
                    )
                })
                .count()
        }),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(MEASURE_CHILD) {
        measure_child(&args[2], &args[3], &args[4..]);
        return;
    }
    if args.get(1).map(String::as_str) == Some(WRITE_EVENTS) {
        write_events(Path::new(&args[2]), args[3].parse().unwrap());
        return;
    }
    let measuring = args.iter().any(|a| a == "--bench");
    let (events, memory_events, rounds) = if measuring {
        (50_000, 200_000, 3)
    } else {
        (2_000, 4_000, 1)
    };
    let binary = podstream_tests::bench_binary(measuring);
    let airflow = Airflow::newest();
    airflow
        .installed()
        .unwrap_or_else(|e| panic!("scripts/setup.sh installs Airflow: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    let size = write_events(&file, events);
    println!("{events} watch events, {size} bytes each on average");
    // The same events in each form users feed decide; Airflow's watcher reads what the
    // apiserver sends, compact lines.
    let forms: Vec<(JsonForm, std::path::PathBuf)> = JsonForm::ALL
        .iter()
        .map(|&form| {
            let path = dir.path().join(format!("events.{}.json", form.name()));
            let mut text = Vec::new();
            for line in BufReader::new(File::open(&file).unwrap()).lines() {
                form.write(&serde_json::from_str(&line.unwrap()).unwrap(), &mut text);
            }
            std::fs::write(&path, text).unwrap();
            (form, path)
        })
        .collect();

    let mut airflow_rates = Vec::new();
    let mut form_rates: Vec<Vec<f64>> = vec![Vec::new(); forms.len()];
    let mut floor_rates: Vec<Vec<f64>> = vec![Vec::new(); forms.len()];
    let mut reader_rates: Vec<Vec<Readers>> = vec![Vec::new(); forms.len()];
    let mut versions = Value::Null;
    for round in 1..=rounds {
        let (run, report) = airflow_watcher(airflow, dir.path(), &file);
        assert_eq!(
            report["events"],
            json!(events),
            "the watcher read every event"
        );
        assert!(
            report["queued"].as_u64().unwrap() > 0,
            "the watcher reported states"
        );
        let airflow_rate = events as f64 / run.seconds;
        airflow_rates.push(airflow_rate);
        versions = json!({"airflow": report["airflow"], "provider": report["provider"]});
        let mut outputs = Vec::new();
        for ((((form, path), rates), floors), readings) in forms
            .iter()
            .zip(&mut form_rates)
            .zip(&mut floor_rates)
            .zip(&mut reader_rates)
        {
            let floor = read_only_rate(path, events);
            floors.push(floor);
            let readers = readers(path, events);
            readings.push(readers);
            let (run, commands) = decide(&binary, path);
            assert!(commands > 0, "decide wrote commands");
            outputs.push(std::fs::read(path.with_extension("out")).unwrap());
            let rate = events as f64 / run.seconds;
            rates.push(rate);
            println!(
                "round {round}, {}: Airflow's watcher {airflow_rate:.0} events/s, podstream \
                 decide {rate:.0} events/s ({commands} commands, peak {:.1} MB): {:.1}x; \
                 serde_json reading the file alone {floor:.0} events/s ({:.1}x); {}",
                form.name(),
                run.peak_rss_mb,
                rate / airflow_rate,
                floor / airflow_rate,
                readers.describe(airflow_rate),
            );
        }
        assert!(
            outputs.iter().all(|output| *output == outputs[0]),
            "every form decides to the same output"
        );
    }
    let airflow_rate = median(airflow_rates);
    for ((((form, _), rates), floors), readings) in forms
        .iter()
        .zip(form_rates)
        .zip(floor_rates)
        .zip(reader_rates)
    {
        let rate = median(rates);
        let floor = median(floors);
        let readers = Readers {
            serde_json: median(readings.iter().map(|r| r.serde_json).collect()),
            sonic_rs: median(readings.iter().map(|r| r.sonic_rs).collect()),
            sonic_fields: median(readings.iter().map(|r| r.sonic_fields).collect()),
            projection: median(readings.iter().map(|r| r.projection).collect()),
        };
        println!(
            "median, {}: Airflow's watcher ({} with provider {}) {airflow_rate:.0} events/s, \
             podstream decide {rate:.0} events/s: {:.1}x; serde_json reading the file alone, \
             one thread, {floor:.0} events/s ({:.1}x); {}",
            form.name(),
            versions["airflow"],
            versions["provider"],
            rate / airflow_rate,
            floor / airflow_rate,
            readers.describe(airflow_rate),
        );
    }

    let big = dir.path().join("memory.jsonl");
    write_events(&big, memory_events);
    let (run, _) = decide(&binary, &big);
    println!(
        "decide over {memory_events} events: peak resident {:.1} MB, {:.0} events/s",
        run.peak_rss_mb,
        memory_events as f64 / run.seconds
    );
}

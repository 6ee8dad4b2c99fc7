//! Soak (issue 27): a month of a large Airflow compressed into an hour, with the memory and
//! storage of every part sampled as it runs.
//!
//! `cargo bench -p podstream-tests --bench soak` drives 1,000,000 worker pods through
//! `podstream run` (release build, its own process) on the simulator, a real nats-server and
//! PostgreSQL holding an Airflow 2.10 schema: each pod Pending → Running → Succeeded (or
//! Failed, one in ten) and then deleted, one in twenty relabelled to another scheduler while
//! it runs, one in a hundred joined by a second pod that fails; `podstream run` is killed -9
//! and started again twice in the first half. Retention is compressed to minutes (streams,
//! buckets and podstream's tables), so a month's churn turns over many times.
//!
//! Every few seconds it samples each process's resident memory, the bytes JetStream stores
//! per stream and bucket, the rows of podstream's tables and the consumers' lag, and writes
//! them as CSV and an SVG chart (`target/soak/`). At the end it checks, for a sample of 1,000
//! task instances, that the database says what the driver did, and reports each bound.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it, so in CI) it drives 25,000 pods
//! with retention of seconds and asserts the bounds (not the speed): storage and tables follow
//! their retention, lag returns to zero, memory does not run away, the sample is right.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use podstream_bus::streams;
use podstream_proto::subject::stream_names;
use podstream_proto::subject::{Stream, Subjects};
use podstream_sim::{Cluster, Server, SimConfig, WorkerPod};
use podstream_sink::Database;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::nats::NatsServer;
use podstream_tests::postgres::PgCluster;
use sqlx::Row;

const DAG: &str = "soak";
const RUN: &str = "manual__soak";
const NS: &str = "airflow";

/// How big and how compressed a run is.
#[derive(Debug, Clone, Copy)]
struct Plan {
    pods: usize,
    /// Pods started per second.
    rate: usize,
    /// The streams' and buckets' max age.
    max_age: Duration,
    /// `podstream_applied` and the per-TI tables.
    retention: Duration,
    /// Where in the run (fractions of the pods) `podstream run` is killed -9 and restarted.
    restarts: &'static [f64],
    sample_every: Duration,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            pods: 1_000_000,
            rate: 300,
            max_age: Duration::from_secs(300),
            retention: Duration::from_secs(600),
            restarts: &[0.2, 0.4],
            sample_every: Duration::from_secs(10),
        }
    }

    fn ci() -> Plan {
        Plan {
            pods: 25_000,
            rate: 250,
            max_age: Duration::from_secs(15),
            retention: Duration::from_secs(30),
            restarts: &[0.3],
            sample_every: Duration::from_secs(5),
        }
    }
}

/// What the driver does to pod `i`, the same on every run.
#[derive(Debug, Clone, Copy)]
struct Fate {
    fails: bool,
    relabelled: bool,
    twin: bool,
}

fn fate(i: usize) -> Fate {
    Fate {
        fails: i % 10 == 3,
        relabelled: i % 20 == 7,
        twin: i % 100 == 11,
    }
}

fn task_id(i: usize) -> String {
    format!("t-{i:07}")
}

/// The task instance's (state, queued_by_job_id) once its pod's story has played.
fn expected(fate: Fate) -> (&'static str, i64) {
    let owner = if fate.relabelled { 2 } else { 1 };
    // The TIs are seeded running with retries left: a failure puts them up for retry; a
    // success leaves what the task itself would have written.
    (
        if fate.fails {
            "up_for_retry"
        } else {
            "running"
        },
        owner,
    )
}

/// Steps of a pod's story and when each comes after its start.
const STEPS: [Duration; 4] = [
    Duration::from_millis(300),
    Duration::from_millis(600),
    Duration::from_millis(1000),
    Duration::from_millis(1500),
];

/// Plays every pod's story at `rate` pods per second, `STEPS` apart; restarts `podstream
/// run` at the plan's points. Counts pods started in `started`.
fn drive(cluster: &Cluster, plan: &Plan, run: &Stage, started: &AtomicUsize) {
    let begin = Instant::now();
    let mut due: [VecDeque<(Instant, usize)>; 4] = Default::default();
    let mut next = 0;
    let mut restarts: VecDeque<usize> = plan
        .restarts
        .iter()
        .map(|at| (at * plan.pods as f64) as usize)
        .collect();
    let interval = Duration::from_secs_f64(1.0 / plan.rate as f64);
    while next < plan.pods || due.iter().any(|q| !q.is_empty()) {
        let now = Instant::now();
        while next < plan.pods && begin + interval * next as u32 <= now {
            let i = next;
            let pod = WorkerPod::new(&task_id(i), "1", DAG, &task_id(i), RUN).to_json();
            cluster.create_pod(pod).unwrap();
            due[0].push_back((now + STEPS[0], i));
            next += 1;
            started.store(next, Ordering::Relaxed);
            if restarts.front() == Some(&i) {
                restarts.pop_front();
                run.restart();
            }
        }
        for step in 0..STEPS.len() {
            while due[step].front().is_some_and(|(at, _)| *at <= now) {
                let Some((_, i)) = due[step].pop_front() else {
                    break;
                };
                play(cluster, step, i);
                if let Some(later) = due.get_mut(step + 1) {
                    later.push_back((now + (STEPS[step + 1] - STEPS[step]), i));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Step `step` of pod `i`'s story.
fn play(cluster: &Cluster, step: usize, i: usize) {
    let name = task_id(i);
    let twin = format!("{name}-twin");
    let fate = fate(i);
    match step {
        0 => {
            cluster.set_phase(NS, &name, "Running").unwrap();
        }
        1 => {
            if fate.relabelled {
                cluster
                    .relabel(NS, &name, "airflow-worker", Some("2"))
                    .unwrap();
            }
            if fate.twin {
                let pod = WorkerPod::new(&twin, "1", DAG, &name, RUN).to_json();
                cluster.create_pod(pod).unwrap();
            }
        }
        2 => {
            let end = if fate.fails { "Failed" } else { "Succeeded" };
            cluster.set_phase(NS, &name, end).unwrap();
            if fate.twin {
                cluster.set_phase(NS, &twin, "Failed").unwrap();
            }
        }
        _ => {
            drop(cluster.delete_pod(NS, &name, Some(0)).unwrap());
            if fate.twin {
                drop(cluster.delete_pod(NS, &twin, Some(0)).unwrap());
            }
        }
    }
}

/// `podstream run` as its own process, restartable with kill -9.
struct Stage {
    binary: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
    log: PathBuf,
    child: Mutex<Child>,
    restarts: AtomicUsize,
}

impl Stage {
    fn spawn(binary: &Path, args: &[String], kubeconfig: &Path, log: &Path) -> Child {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        Command::new(binary)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("PODSTREAM_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    }

    fn pid(&self) -> u32 {
        self.child.lock().unwrap().id()
    }

    fn restart(&self) {
        let mut child = self.child.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        *child = Stage::spawn(&self.binary, &self.args, &self.kubeconfig, &self.log);
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    fn stop(&self) {
        let mut child = self.child.lock().unwrap();
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
    }
}

/// One sample of everything that must stay bounded.
#[derive(Debug, Clone, Default)]
struct Sample {
    at: f64,
    pods: usize,
    run_mb: u64,
    nats_mb: u64,
    /// Bytes stored per stream and bucket, in `stores()` order.
    stored: Vec<u64>,
    /// Rows of podstream's tables, in `TABLES` order.
    rows: Vec<i64>,
    process_lag: u64,
    sink_lag: u64,
}

/// The streams and buckets sampled, each bucket by the stream JetStream keeps it in.
fn stores() -> [String; 5] {
    let subjects = Subjects::default();
    [
        subjects.stream_name(Stream::PodEvents),
        subjects.stream_name(Stream::Commands),
        subjects.stream_name(Stream::DeadLetters),
        streams::bucket_stream(podstream_bus::streams::DEFAULT_RECORDS_BUCKET),
        streams::bucket_stream(podstream_ingest::service::DEFAULT_CHECKPOINT_BUCKET),
    ]
}
const TABLES: [&str; 4] = [
    "podstream_applied",
    "podstream_ti_pod",
    "podstream_ti_owner",
    "podstream_duplicate",
];

async fn sample(
    js: &jetstream::Context,
    db: &Database,
    run: &Stage,
    nats: &NatsServer,
    at: f64,
    pods: usize,
) -> Sample {
    let stores = stores();
    let mut stored = Vec::with_capacity(stores.len());
    for name in &stores {
        let bytes = match js.get_stream(name).await {
            Ok(mut stream) => stream.info().await.map_or(0, |info| info.state.bytes),
            Err(_) => 0,
        };
        stored.push(bytes);
    }
    let mut rows = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        let count = sqlx::query(&format!("SELECT CAST(COUNT(*) AS BIGINT) FROM {table}"))
            .fetch_one(&db.pool)
            .await
            .map_or(-1, |row| row.get::<i64, _>(0));
        rows.push(count);
    }
    let lag = |stream: &'static str, consumer: &'static str| async move {
        let stream = js.get_stream(stream).await.ok()?;
        let mut consumer: jetstream::consumer::PullConsumer =
            stream.get_consumer(consumer).await.ok()?;
        let info = consumer.info().await.ok()?;
        Some(info.num_pending + info.num_ack_pending as u64)
    };
    Sample {
        at,
        pods,
        run_mb: podstream_tests::rss_mb(run.pid()).0,
        nats_mb: nats.pid().map_or(0, |pid| podstream_tests::rss_mb(pid).0),
        stored,
        rows,
        process_lag: lag(stream_names::PODS, "podstream-process")
            .await
            .unwrap_or(0),
        sink_lag: lag(stream_names::COMMANDS, "podstream-sink")
            .await
            .unwrap_or(0),
    }
}

fn write_csv(samples: &[Sample], path: &Path) {
    let mut text = String::from("seconds,pods_started,run_rss_mb,nats_rss_mb");
    for store in stores() {
        text.push_str(&format!(",{store}_bytes"));
    }
    for table in TABLES {
        text.push_str(&format!(",{table}_rows"));
    }
    text.push_str(",process_lag,sink_lag\n");
    for s in samples {
        text.push_str(&format!(
            "{:.1},{},{},{}",
            s.at, s.pods, s.run_mb, s.nats_mb
        ));
        for bytes in &s.stored {
            text.push_str(&format!(",{bytes}"));
        }
        for rows in &s.rows {
            text.push_str(&format!(",{rows}"));
        }
        text.push_str(&format!(",{},{}\n", s.process_lag, s.sink_lag));
    }
    std::fs::write(path, text).unwrap();
}

/// Four panels over time: resident memory, JetStream storage, podstream's table rows, lag.
fn write_chart(samples: &[Sample], path: &Path) {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1100, 900)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let panels = root.split_evenly((4, 1));
    let end = samples.last().map_or(1.0, |s| s.at).max(1.0);
    let colours = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    let draw = |area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
                title: &str,
                series: Vec<(String, Vec<(f64, f64)>)>| {
        let top = series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|(_, y)| *y))
            .fold(1.0_f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(24)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..end, 0.0..top)
            .unwrap();
        chart
            .configure_mesh()
            .x_desc("seconds")
            .light_line_style(WHITE)
            .draw()
            .unwrap();
        for (index, (name, points)) in series.into_iter().enumerate() {
            let colour = colours[index % colours.len()];
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .unwrap()
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .unwrap();
    };
    let line = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        samples.iter().map(|s| (s.at, f(s))).collect()
    };
    draw(
        &panels[0],
        "resident memory (MB)",
        vec![
            ("podstream run".into(), line(&|s| s.run_mb as f64)),
            ("nats-server".into(), line(&|s| s.nats_mb as f64)),
        ],
    );
    draw(
        &panels[1],
        "JetStream storage (MB)",
        stores()
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), line(&|s: &Sample| s.stored[i] as f64 / 1e6)))
            .collect(),
    );
    draw(
        &panels[2],
        "podstream's table rows",
        TABLES
            .iter()
            .enumerate()
            .map(|(i, name)| ((*name).to_owned(), line(&|s: &Sample| s.rows[i] as f64)))
            .collect(),
    );
    draw(
        &panels[3],
        "consumer lag (messages)",
        vec![
            ("processor".into(), line(&|s| s.process_lag as f64)),
            ("sink".into(), line(&|s| s.sink_lag as f64)),
        ],
    );
    root.present().unwrap();
}

/// The spread of `values` around their mean, as a fraction of it: (min, max) - 1.
fn spread(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let low = values.iter().copied().fold(f64::MAX, f64::min);
    let high = values.iter().copied().fold(f64::MIN, f64::max);
    (low / mean - 1.0, high / mean - 1.0)
}

async fn seed(db: &Database, pods: usize) {
    db.seed(DAG, RUN, &[]).await.unwrap();
    let chunk = 100_000;
    for from in (0..pods).step_by(chunk) {
        let to = (from + chunk).min(pods);
        podstream_tests::sink::seed_running_tis(db, DAG, RUN, "t-", from..to, 7).await;
    }
}

fn hours(duration: Duration) -> String {
    format!("{}", duration.as_secs_f64() / 3600.0)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let plan = if full { Plan::full() } else { Plan::ci() };
    let binary = podstream_tests::bench_binary(full);
    let runtime = podstream_tests::bench_runtime();
    let out = podstream_tests::workspace_root().join("target/soak");
    std::fs::create_dir_all(&out).unwrap();
    let name = if full { "soak" } else { "soak-ci" };
    runtime.block_on(async move {
        let nats = NatsServer::start();
        let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let pg = PgCluster::start();
        let target = AirflowDb::postgres(Airflow::line("2.10"), &pg, "soak");
        let db = Database::connect(&target.url).await.unwrap();
        let seeding = Instant::now();
        seed(&db, plan.pods).await;
        println!("soak: {} task instances seeded in {:.1} s", plan.pods, seeding.elapsed().as_secs_f64());

        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let config = SimConfig {
            namespaces: vec![NS.into()],
            retain_events: 200_000,
            ..SimConfig::default()
        };
        let sim = Server::start(addr, config).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let args: Vec<String> = [
            "run",
            "--nats",
            &nats.url(),
            "--db",
            &target.url,
            "--namespaces",
            NS,
            "--max-age-hours",
            &hours(plan.max_age),
            "--duplicate-window-seconds",
            &(plan.max_age.as_secs() / 2).to_string(),
            "--applied-retention-hours",
            &hours(plan.retention),
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        let log = out.join(format!("{name}-run.log"));
        let _ = std::fs::remove_file(&log);
        let stage = Arc::new(Stage {
            child: Mutex::new(Stage::spawn(&binary, &args, &kubeconfig, &log)),
            binary: binary.clone(),
            args,
            kubeconfig: kubeconfig.clone(),
            log: log.clone(),
            restarts: AtomicUsize::new(0),
        });
        tokio::time::sleep(Duration::from_secs(2)).await;

        let started = Arc::new(AtomicUsize::new(0));
        let progress = indicatif::ProgressBar::new(plan.pods as u64);
        progress.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} pods {msg}")
                .unwrap(),
        );
        let driver = {
            let cluster = sim.cluster().clone();
            let stage = stage.clone();
            let started = started.clone();
            tokio::task::spawn_blocking(move || drive(&cluster, &plan, &stage, &started))
        };
        let begin = Instant::now();
        let mut samples: Vec<Sample> = Vec::new();
        let mut ticker = tokio::time::interval(plan.sample_every);
        let mut drained_at = None;
        loop {
            ticker.tick().await;
            let pods = started.load(Ordering::Relaxed);
            let one = sample(&js, &db, &stage, &nats, begin.elapsed().as_secs_f64(), pods).await;
            progress.set_position(pods as u64);
            progress.set_message(format!(
                "run {} MB, nats {} MB, lag {}/{}, applied rows {}",
                one.run_mb, one.nats_mb, one.process_lag, one.sink_lag, one.rows[0]
            ));
            let drained = driver.is_finished() && one.process_lag == 0 && one.sink_lag == 0;
            samples.push(one);
            if drained && drained_at.is_none() {
                drained_at = Some(Instant::now());
            }
            // Once drained, one more retention and a prune: the tables' last rows age out.
            let aged = plan.retention + podstream_sink::retention::prune_every(plan.retention);
            if drained_at.is_some_and(|at| at.elapsed() > aged + Duration::from_secs(5)) {
                break;
            }
            assert!(
                begin.elapsed() < Duration::from_secs(3 * 3600),
                "the soak did not drain: {:?}",
                samples.last()
            );
        }
        progress.finish();
        driver.await.unwrap();
        let seconds = begin.elapsed().as_secs_f64();
        write_csv(&samples, &out.join(format!("{name}.csv")));
        write_chart(&samples, &out.join(format!("{name}.svg")));

        // The sample: every thousandth task instance as the database has it.
        let step = (plan.pods / 1000).max(1);
        let mut wrong = Vec::new();
        for i in (0..plan.pods).step_by(step) {
            let row = sqlx::query(
                "SELECT state, CAST(queued_by_job_id AS BIGINT) FROM task_instance WHERE dag_id = $1 AND task_id = $2",
            )
            .bind(DAG)
            .bind(task_id(i))
            .fetch_one(&db.pool)
            .await
            .unwrap();
            let have = (
                row.get::<Option<String>, _>(0).unwrap_or_default(),
                row.get::<Option<i64>, _>(1).unwrap_or_default(),
            );
            let want = expected(fate(i));
            if (have.0.as_str(), have.1) != want {
                wrong.push((task_id(i), have, want));
            }
        }
        let checked = plan.pods.div_ceil(step);

        // Bounds, over the second half of the run (after the restarts, which are in the first).
        let driving: Vec<&Sample> = samples.iter().filter(|s| s.pods < plan.pods || s.process_lag > 0).collect();
        let half: Vec<&Sample> = driving[driving.len() / 2..].to_vec();
        let (run_low, run_high) = spread(&half.iter().map(|s| s.run_mb as f64).collect::<Vec<_>>());
        let (nats_low, nats_high) = spread(&half.iter().map(|s| s.nats_mb as f64).collect::<Vec<_>>());
        let first_half_peak = driving[..driving.len() / 2].iter().map(|s| s.run_mb).max().unwrap_or(0);
        let second_half_peak = half.iter().map(|s| s.run_mb).max().unwrap_or(0);
        let last = samples.last().cloned().unwrap_or_default();
        let peak_stored: Vec<u64> = (0..stores().len())
            .map(|i| samples.iter().map(|s| s.stored[i]).max().unwrap_or(0))
            .collect();
        let peak_rows: Vec<i64> = (0..TABLES.len())
            .map(|i| samples.iter().map(|s| s.rows[i]).max().unwrap_or(0))
            .collect();
        let mut pods_stream = js.get_stream(stream_names::PODS).await.unwrap();
        let pods_state = pods_stream.info().await.unwrap().state.clone();
        let mut commands_stream = js.get_stream(stream_names::COMMANDS).await.unwrap();
        let commands_state = commands_stream.info().await.unwrap().state.clone();

        println!(
            "soak: {} pods in {seconds:.0} s ({:.0} pods/s, {} restarts of podstream run), {} samples -> target/soak/{name}.csv, .svg",
            plan.pods,
            plan.pods as f64 / seconds,
            stage.restarts.load(Ordering::Relaxed),
            samples.len()
        );
        println!(
            "  memory, second half: podstream run {:+.1}% / {:+.1}% around its mean (peak {second_half_peak} MB; first half {first_half_peak} MB), nats-server {:+.1}% / {:+.1}%",
            run_low * 100.0, run_high * 100.0, nats_low * 100.0, nats_high * 100.0
        );
        println!(
            "  pods stream: {} events published, {} kept at the end ({} MB; peak {:.1} MB); commands stream: {} published, {} kept",
            pods_state.last_sequence,
            pods_state.messages,
            pods_state.bytes / 1_000_000,
            peak_stored[0] as f64 / 1e6,
            commands_state.last_sequence,
            commands_state.messages
        );
        for (i, table) in TABLES.iter().enumerate() {
            println!("  {table}: peak {} rows, {} at the end", peak_rows[i], last.rows[i]);
        }
        println!("  lag at the end: processor {}, sink {}", last.process_lag, last.sink_lag);
        println!("  sample: {} of {checked} task instances as the driver left them", checked - wrong.len());

        stage.stop();
        assert!(wrong.is_empty(), "task instances not as the driver left them: {:?}", &wrong[..wrong.len().min(10)]);
        assert_eq!((last.process_lag, last.sink_lag), (0, 0), "lag returns to zero");
        // Storage follows retention: what is kept at the end is a fraction of what passed.
        for (name, state) in [("pods", &pods_state), ("commands", &commands_state)] {
            assert!(
                state.messages * 2 < state.last_sequence,
                "the {name} stream keeps {} of {} messages: its max age does not bound it",
                state.messages,
                state.last_sequence
            );
        }
        // The tables follow their retention: their rows at the end are a fraction of the peak
        // (every pod is gone by then, so nothing recorded alive is kept).
        for (i, table) in TABLES.iter().enumerate() {
            assert!(
                last.rows[i] * 2 <= peak_rows[i].max(1),
                "{table}: {} rows at the end, peak {}",
                last.rows[i],
                peak_rows[i]
            );
        }
        // Memory does not run away: the second half's peak stays near the first half's.
        assert!(
            second_half_peak as f64 <= first_half_peak as f64 * 1.5 + 16.0,
            "podstream run grew from {first_half_peak} MB to {second_half_peak} MB"
        );
    });
}

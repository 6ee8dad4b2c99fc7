//! What a real Airflow scheduler spends per task, and how soon a failed pod's task instance
//! moves, under load: the provider's `KubernetesExecutor` beside podstream's, one after the
//! other in one run, on the same machine, DAG and simulator.
//!
//! `cargo bench -p podstream-tests --bench scheduler_load [-- --tasks N --in-flight P
//! --pod-seconds S --killed-after K --rounds R]`, per executor and round (R rounds, 1, the
//! order swapped each round):
//! 1. a real Airflow (the newest supported release) on `podstream sim --kubelet`, PostgreSQL,
//!    and for podstream `podstream run` on a nats-server, as the stage runs them; DAG
//!    `podstream_load` (stage/airflow/dags/load): N tasks, each TI going to `up_for_retry`
//!    (the retry an hour away) once its pod fails. Two loads:
//!    - *queued* (the default; N 500, P 200): each pod's container sleeps S seconds (40),
//!      then exits 1 without running the task, so the TI is still queued and the executor's
//!      report is what moves it. The stock executor beside podstream's executor;
//!    - *running* (`--killed-after K`; N 60, P 20): each pod runs the task, and the kubelet
//!      kills it (OOMKilled) K seconds after it starts, so the TI is running: the stock
//!      executor, podstream's executor, and the stock executor beside podstream's sink
//!      (`--task-failures sink`), which fails a running TI itself;
//! 2. with `default_pool` at 0 slots the scheduler schedules every TI and queues none; its
//!    idle CPU is read over ten seconds; then the pool opens to P slots, which keeps P pods in
//!    flight;
//! 3. until every TI is `up_for_retry`: the scheduler's process group's CPU seconds (its own,
//!    its executor's watcher process, all reaped children: `/proc/<pid>/stat`) per task, the
//!    part of it in child processes (stock's `KubernetesJobWatcher`), that above its idle
//!    rate, `podstream run`'s CPU per task, and per TI the time from the pod's `Failed` (seen
//!    by a `kubectl get pods -w` beside it) to the TI's `end_date`, p50 and p99; how many TIs
//!    podstream's sink failed (its `podstream_fail` log rows); the scheduler's own
//!    `scheduler.scheduler_loop_duration` and `scheduler.executor_heartbeat_duration` (the
//!    statsd metrics Airflow sends, received by this bench), p50 and p99; then each of
//!    podstream's over stock's, per round and the median of the rounds.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a smoke run: podstream's
//! executor on four queued tasks, and podstream's sink on two running ones.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use podstream_stage::airflow::Airflow;
use podstream_stage::real_airflow::{Dags, Executor, Kubernetes, RealAirflow};
use podstream_tests::{KubectlWatch, ProcessCpu};

const DAG: &str = "podstream_load";

/// The run's shape.
#[derive(Debug, Clone, Copy)]
struct Load {
    tasks: usize,
    in_flight: usize,
    pod_seconds: u64,
    /// Running tasks, their pods killed this many seconds after they start; else queued
    /// tasks, their pods exiting after `pod_seconds`.
    killed_after: Option<u64>,
}

impl Load {
    /// The executors measured on this load, stock first.
    fn executors(self) -> Vec<Executor> {
        match self.killed_after {
            None => vec![Executor::Stock, Executor::Podstream],
            Some(_) => vec![Executor::Stock, Executor::Podstream, Executor::Sink],
        }
    }
}

/// What one executor's run measured.
#[derive(Debug, Clone)]
struct Measured {
    executor: Executor,
    drain_seconds: f64,
    scheduler_cpu: f64,
    /// The part of `scheduler_cpu` spent in the scheduler's child processes (the stock
    /// executor's `KubernetesJobWatcher` is one).
    children_cpu: f64,
    idle_cpu_per_second: f64,
    podstream_cpu: Option<f64>,
    /// Seconds from each pod's `Failed` to its TI's `end_date`, sorted.
    latencies: Vec<f64>,
    /// The scheduler's own timings while it drained, in ms, sorted.
    timings: Timings,
    /// How many TIs podstream's sink failed (its `podstream_fail` log rows that changed the
    /// state; in executor mode they record the fail and change nothing).
    failed_by_sink: usize,
    /// How many TIs ran (their task started in the pod) before the pod failed.
    ran: usize,
}

/// The scheduler's timings from the statsd metrics Airflow sends, in ms, each sorted.
#[derive(Debug, Clone, Default)]
struct Timings {
    /// `scheduler.scheduler_loop_duration`: one scheduler loop.
    loops: Vec<f64>,
    /// `scheduler.executor_heartbeat_duration`: the executor's part of a loop (its sync).
    heartbeats: Vec<f64>,
}

/// The metric of a loop, as Airflow names it with statsd's default prefix.
const LOOP_METRIC: &str = "airflow.scheduler.scheduler_loop_duration";
/// The metric of the executor's heartbeat.
const HEARTBEAT_METRIC: &str = "airflow.scheduler.executor_heartbeat_duration";

/// A statsd receiver: keeps Airflow's loop and heartbeat timings while `recording` is set.
struct Statsd {
    port: u16,
    recording: Arc<std::sync::atomic::AtomicBool>,
    timings: Arc<Mutex<Timings>>,
}

impl Statsd {
    fn start() -> Statsd {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let recording = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let timings: Arc<Mutex<Timings>> = Arc::default();
        let (on, kept) = (recording.clone(), Arc::downgrade(&timings));
        std::thread::spawn(move || {
            let mut buffer = [0u8; 65_536];
            while let Ok(read) = socket.recv(&mut buffer) {
                let Some(timings) = kept.upgrade() else {
                    return;
                };
                if !on.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                // One datagram may carry several lines: `name:value|ms`.
                for line in String::from_utf8_lossy(&buffer[..read]).lines() {
                    let Some((name, rest)) = line.split_once(':') else {
                        continue;
                    };
                    let Some(ms) = rest.strip_suffix("|ms").and_then(|v| v.parse().ok()) else {
                        continue;
                    };
                    let mut timings = timings.lock().unwrap();
                    match name {
                        LOOP_METRIC => timings.loops.push(ms),
                        HEARTBEAT_METRIC => timings.heartbeats.push(ms),
                        _ => {}
                    }
                }
            }
        });
        Statsd {
            port,
            recording,
            timings,
        }
    }

    /// Airflow's settings that send its metrics here.
    fn settings(&self) -> [(&'static str, String); 3] {
        [
            ("AIRFLOW__METRICS__STATSD_ON", "True".to_owned()),
            ("AIRFLOW__METRICS__STATSD_HOST", "127.0.0.1".to_owned()),
            ("AIRFLOW__METRICS__STATSD_PORT", self.port.to_string()),
        ]
    }

    fn record(&self, on: bool) {
        self.recording
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn take(&self) -> Timings {
        let mut timings = std::mem::take(&mut *self.timings.lock().unwrap());
        timings.loops.sort_by(f64::total_cmp);
        timings.heartbeats.sort_by(f64::total_cmp);
        timings
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (loads, rounds) = if bench {
        let killed_after = podstream_tests::bench_option("--killed-after", 0) as u64;
        let (tasks, in_flight) = if killed_after > 0 {
            (60, 20)
        } else {
            (500, 200)
        };
        let load = Load {
            tasks: podstream_tests::bench_option("--tasks", tasks),
            in_flight: podstream_tests::bench_option("--in-flight", in_flight),
            pod_seconds: podstream_tests::bench_option("--pod-seconds", 40) as u64,
            killed_after: (killed_after > 0).then_some(killed_after),
        };
        let executors = load.executors();
        (
            vec![(load, executors)],
            podstream_tests::bench_option("--rounds", 1),
        )
    } else {
        let queued = Load {
            tasks: 4,
            in_flight: 4,
            pod_seconds: 2,
            killed_after: None,
        };
        let running = Load {
            tasks: 2,
            in_flight: 2,
            pod_seconds: 0,
            killed_after: Some(20),
        };
        (
            vec![
                (queued, vec![Executor::Podstream]),
                (running, vec![Executor::Sink]),
            ],
            1,
        )
    };
    podstream_stage::use_podstream_binary(podstream_tests::bench_binary(bench));
    for (load, executors) in loads {
        measure(load, &executors, rounds);
    }
}

/// Runs `executors` on `load` for `rounds` rounds, and prints each round and the ratios.
fn measure(load: Load, executors: &[Executor], rounds: usize) {
    match load.killed_after {
        None => println!(
            "{} queued tasks, {} in flight, each pod failing after {} s; Airflow {}",
            load.tasks,
            load.in_flight,
            load.pod_seconds,
            Airflow::newest().short()
        ),
        Some(after) => println!(
            "{} running tasks, {} in flight, each pod killed {after} s after it starts; Airflow {}",
            load.tasks,
            load.in_flight,
            Airflow::newest().short()
        ),
    }
    let mut ratios: BTreeMap<&'static str, Vec<Ratios>> = BTreeMap::new();
    for round in 1..=rounds {
        // Each round swaps the order, so a drift of the machine hits both.
        let mut order = executors.to_vec();
        if round % 2 == 0 {
            order.reverse();
        }
        let mut measured: Vec<Measured> = order
            .into_iter()
            .map(|executor| {
                let measured = run(executor, load);
                println!("round {round}: {}", line(&measured, load));
                measured
            })
            .collect();
        measured.sort_by_key(|m| executors.iter().position(|e| *e == m.executor));
        println!("\nround {round}:\n{}", table(&measured, load));
        // Stock comes first when measured: each other one over it.
        if let [stock, others @ ..] = &measured[..] {
            for other in others {
                let of = Ratios::of(stock, other);
                println!("{} / stock: {of}", name(other.executor));
                ratios.entry(name(other.executor)).or_default().push(of);
            }
        }
    }
    if rounds > 1 {
        for (executor, all) in &ratios {
            println!(
                "median of {} rounds, {executor} / stock: {}",
                all.len(),
                Ratios::median(all)
            );
        }
    }
}

fn run(executor: Executor, load: Load) -> Measured {
    let statsd = Statsd::start();
    let killed_after = load
        .killed_after
        .map(|after| ("PODSTREAM_LOAD_KILLED_AFTER_SECONDS", after.to_string()));
    let settings = [
        ("PODSTREAM_LOAD_TASKS", load.tasks.to_string()),
        ("PODSTREAM_LOAD_POD_SECONDS", load.pod_seconds.to_string()),
        ("AIRFLOW__CORE__PARALLELISM", load.in_flight.to_string()),
        // The provider's default launches one pod per scheduler loop.
        (
            "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_PODS_CREATION_BATCH_SIZE",
            "16".to_owned(),
        ),
    ]
    .into_iter()
    .chain(killed_after)
    .chain(statsd.settings())
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut real = RealAirflow::set_up_with(
        Airflow::newest(),
        Dags::Load,
        executor,
        Kubernetes::Simulated,
        settings,
    );
    real.set_default_pool_slots(0);
    real.start_components();
    let scheduled = format!(
        "SELECT count(*) FROM task_instance WHERE dag_id = '{DAG}' AND state = 'scheduled'"
    );
    real.wait_until("every task scheduled", Duration::from_secs(600), |real| {
        count(real, &scheduled) == load.tasks
    });
    let scheduler = real.pid(real.component("scheduler").unwrap()).unwrap();
    let podstream = real.podstream_pid();

    // The scheduler's own cost with nothing to launch: its loop, heartbeats, the DAG run.
    let idle_from = (group_cpu_seconds(scheduler), Instant::now());
    std::thread::sleep(Duration::from_secs(10));
    let idle_cpu_per_second =
        (group_cpu_seconds(scheduler) - idle_from.0) / idle_from.1.elapsed().as_secs_f64();

    let failed = watch_failures(&real.kubeconfig);
    let group_from = group_cpu_seconds(scheduler);
    let own_from = podstream_tests::cpu_seconds(scheduler);
    let podstream_from = podstream.map(podstream_tests::cpu_seconds);
    let started = Instant::now();
    statsd.record(true);
    real.set_default_pool_slots(u32::try_from(load.in_flight).unwrap());
    let retrying = format!(
        "SELECT count(*) FROM task_instance WHERE dag_id = '{DAG}' AND state = 'up_for_retry'"
    );
    let waves = load.tasks.div_ceil(load.in_flight) as u64;
    real.wait_until(
        "every task up for retry",
        Duration::from_secs(waves * (load.pod_seconds + 60) + 300),
        |real| count(real, &retrying) == load.tasks,
    );
    let drain_seconds = started.elapsed().as_secs_f64();
    statsd.record(false);
    let timings = statsd.take();
    assert!(
        !timings.loops.is_empty(),
        "the scheduler sent its loop timings (scripts/setup.sh installs statsd)"
    );
    let scheduler_cpu = group_cpu_seconds(scheduler) - group_from;
    let children_cpu = scheduler_cpu - (podstream_tests::cpu_seconds(scheduler) - own_from);
    let podstream_cpu = podstream
        .zip(podstream_from)
        .map(|(pid, from)| podstream_tests::cpu_seconds(pid) - from);

    let ended: BTreeMap<String, f64> = real
        .query(&format!(
            "SELECT task_id, extract(epoch FROM end_date) FROM task_instance \
             WHERE dag_id = '{DAG}' AND state = 'up_for_retry'"
        ))
        .into_iter()
        .filter_map(|row| Some((row.first()?.clone(), row.get(1)?.parse().ok()?)))
        .collect();
    let failed = std::mem::take(&mut *failed.lock().unwrap());
    let mut latencies: Vec<f64> = ended
        .iter()
        .filter_map(|(task, end)| Some(end - failed.get(task)?))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let failed_by_sink = count(
        &real,
        &format!(
            "SELECT count(DISTINCT task_id) FROM log WHERE dag_id = '{DAG}' \
             AND owner = 'podstream' AND event = 'podstream_fail' \
             AND extra LIKE '%\"state\":\"up_for_retry\"%'"
        ),
    );
    let ran = count(
        &real,
        &format!(
            "SELECT count(*) FROM task_instance WHERE dag_id = '{DAG}' \
             AND coalesce(hostname, '') <> ''"
        ),
    );
    assert_eq!(
        latencies.len(),
        load.tasks,
        "a pod's Failed seen for every TI up for retry ({} of {})",
        latencies.len(),
        load.tasks
    );
    Measured {
        executor,
        drain_seconds,
        scheduler_cpu,
        children_cpu,
        idle_cpu_per_second,
        podstream_cpu,
        latencies,
        timings,
        failed_by_sink,
        ran,
    }
}

fn count(real: &RealAirflow, sql: &str) -> usize {
    real.query(sql)
        .first()
        .and_then(|row| row.first())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Watches the worker pods and keeps, per task id, the wall-clock second its pod was first
/// seen `Failed`, for as long as the stage lives.
fn watch_failures(kubeconfig: &std::path::Path) -> Arc<Mutex<BTreeMap<String, f64>>> {
    let failed: Arc<Mutex<BTreeMap<String, f64>>> = Arc::default();
    let watch = KubectlWatch::start(
        kubeconfig,
        &["get", "pods", "-n", "airflow", "-w", "-o", "json"],
    );
    let seen = Arc::downgrade(&failed);
    std::thread::spawn(move || {
        loop {
            let pod = watch.next();
            let Some(seen) = seen.upgrade() else {
                return; // the run is over.
            };
            let Some(pod) = pod else {
                continue; // quiet for a while.
            };
            if pod["status"]["phase"] != "Failed" {
                continue;
            }
            let Some(task) = pod["metadata"]["annotations"]["task_id"].as_str() else {
                continue;
            };
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            seen.lock()
                .unwrap()
                .entry(task.to_owned())
                .or_insert(now.as_secs_f64());
        }
    });
    failed
}

/// CPU seconds of every process in process group `group`, each with its reaped children.
fn group_cpu_seconds(group: u32) -> f64 {
    ProcessCpu::all()
        .into_iter()
        .filter(|cpu| cpu.group == group)
        .map(ProcessCpu::with_children)
        .sum()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or(f64::NAN)
}

fn name(executor: Executor) -> &'static str {
    match executor {
        Executor::Stock => "stock KubernetesExecutor",
        Executor::Podstream => "PodstreamKubernetesExecutor",
        Executor::Sink => "stock + podstream sink",
        Executor::Installed => "installed",
    }
}

const HEADER: &str = "executor                     drain s  sched CPU s  CPU/task ms  children  idle CPU/s  podstream/task ms   p50 ms   p99 ms  ran  by sink  loops  loop p50/p99 ms  heartbeat p50/p99 ms";

fn line(m: &Measured, load: Load) -> String {
    let per_task = |cpu: f64| cpu / load.tasks as f64 * 1000.0;
    format!(
        "{:<28} {:>7.1} {:>12.1} {:>12.1} {:>9.1} {:>11.3} {:>18} {:>8.0} {:>8.0} {:>4} {:>8} {:>6} {:>16} {:>21}",
        name(m.executor),
        m.drain_seconds,
        m.scheduler_cpu,
        per_task(m.scheduler_cpu),
        per_task(m.children_cpu),
        m.idle_cpu_per_second,
        m.podstream_cpu
            .map_or_else(|| "-".to_owned(), |c| format!("{:.1}", per_task(c))),
        percentile(&m.latencies, 0.5) * 1000.0,
        percentile(&m.latencies, 0.99) * 1000.0,
        m.ran,
        m.failed_by_sink,
        m.timings.loops.len(),
        spread(&m.timings.loops),
        spread(&m.timings.heartbeats),
    )
}

/// `p50/p99` of sorted timings in ms.
fn spread(sorted: &[f64]) -> String {
    format!(
        "{:.0}/{:.0}",
        percentile(sorted, 0.5),
        percentile(sorted, 0.99)
    )
}

fn table(measured: &[Measured], load: Load) -> String {
    let mut table = HEADER.to_owned();
    for m in measured {
        table.push('\n');
        table.push_str(&line(m, load));
    }
    table
}

/// One of podstream's over stock's, one round.
#[derive(Debug, Clone, Copy)]
struct Ratios {
    cpu_per_task: f64,
    cpu_above_idle: f64,
    p50: f64,
    p99: f64,
}

impl Ratios {
    fn of(stock: &Measured, podstream: &Measured) -> Ratios {
        let above_idle = |m: &Measured| m.scheduler_cpu - m.idle_cpu_per_second * m.drain_seconds;
        let p = |m: &Measured, p: f64| percentile(&m.latencies, p);
        Ratios {
            cpu_per_task: podstream.scheduler_cpu / stock.scheduler_cpu,
            cpu_above_idle: above_idle(podstream) / above_idle(stock),
            p50: p(podstream, 0.5) / p(stock, 0.5),
            p99: p(podstream, 0.99) / p(stock, 0.99),
        }
    }

    fn median(all: &[Ratios]) -> Ratios {
        let median = |pick: fn(&Ratios) -> f64| {
            let mut values: Vec<f64> = all.iter().map(pick).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        Ratios {
            cpu_per_task: median(|r| r.cpu_per_task),
            cpu_above_idle: median(|r| r.cpu_above_idle),
            p50: median(|r| r.p50),
            p99: median(|r| r.p99),
        }
    }
}

impl std::fmt::Display for Ratios {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            // Three places for latency: the sink's is a few ms beside stock's seconds.
            "scheduler CPU per task {:.2}× ({:.2}× above each one's idle), p50 {:.3}×, p99 {:.3}×",
            self.cpu_per_task, self.cpu_above_idle, self.p50, self.p99
        )
    }
}

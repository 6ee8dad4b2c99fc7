//! Crash recovery, played: the pipeline on the simulator, a real nats-server and an Airflow
//! 2.10 SQLite database made by its migrations. One stage is killed with SIGKILL just after a
//! running pod failed, pods change while it is down, and the same stage starts again. The
//! database must end right with every command applied once; what is measured is the time
//! from the kill, and from the restart, to the last commit.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use podstream_sim::{Server, SimConfig, WorkerPod};
use podstream_sink::Database;
use podstream_sink::seed::SeedTi;
use podstream_stage::airflow::{Airflow, AirflowDb};
use podstream_stage::nats::NatsServer;
use sqlx::Row;

use crate::component::Component;
pub use crate::component::NS;
use podstream_proto::subject::stream_names;

const DAG: &str = "recovery";
const RUN: &str = "manual__2026-12-02";
const TASKS: [&str; 5] = ["failed", "failed-later", "adopted", "succeeded", "running"];
/// Commands in all: `running` for each pod, then fail, fail, transfer and completed.
const COMMANDS: i64 = 9;

/// The stage a round kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `podstream run`: the three in one process.
    Run,
    /// `podstream ingest`, beside a separate processor and sink.
    Ingest,
    /// `podstream process`, beside a separate ingest and sink.
    Process,
    /// `podstream sink`, beside a separate ingest and processor.
    Sink,
}

impl Stage {
    /// Every stage.
    pub const ALL: [Stage; 4] = [Stage::Run, Stage::Ingest, Stage::Process, Stage::Sink];

    /// The subcommand.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Run => "run",
            Stage::Ingest => "ingest",
            Stage::Process => "process",
            Stage::Sink => "sink",
        }
    }
}

/// One round: which stage dies, when, and with which ack wait.
#[derive(Debug, Clone, Copy)]
pub struct Kill {
    /// The stage killed.
    pub stage: Stage,
    /// How long after the pod's failure was written.
    pub after: Duration,
    /// How long the stage stays down, while other pods change.
    pub down: Duration,
    /// `--ack-wait-seconds` of the processor and the sink.
    pub ack_wait_seconds: u64,
    /// Whether the database is locked from just before the failure until just after the
    /// restart, so the sink certainly holds the fail command, unapplied, when it dies.
    pub lock_database: bool,
}

/// What a round measured.
#[derive(Debug, Clone, Copy)]
pub struct Recovery {
    /// Seconds from the kill to the last commit.
    pub from_kill: f64,
    /// Seconds from the restart (the new process spawned) to the last commit.
    pub from_restart: f64,
}

/// The simulator serving `NS`, and a directory holding its kubeconfig.
///
/// # Panics
/// When it cannot start.
pub async fn simulator() -> (Server, tempfile::TempDir) {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = Server::start(
        addr,
        SimConfig {
            namespaces: vec![NS.into()],
            bookmark_interval: Duration::from_millis(500),
            ..SimConfig::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("starting the simulator: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    server
        .write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap_or_else(|e| panic!("writing the kubeconfig: {e}"));
    (server, dir)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// What a round plays on: the simulator (beside the directory of its kubeconfig), a
/// nats-server and an Airflow 2.10 SQLite database made by its migrations, holding one
/// running task instance per task.
struct Ground {
    sim: Server,
    dir: tempfile::TempDir,
    nats: NatsServer,
    target: AirflowDb,
    db: Database,
}

impl Ground {
    /// Starts it, the task instances seeded with `max_tries`.
    async fn lay(tasks: &[&str], max_tries: i64) -> Ground {
        let (sim, dir) = simulator().await;
        let nats = NatsServer::start();
        let target = AirflowDb::sqlite(Airflow::oldest());
        let db = Database::connect(&target.url)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let tis: Vec<SeedTi<'_>> = tasks
            .iter()
            .map(|t| SeedTi::running(t, max_tries))
            .collect();
        db.seed(DAG, RUN, &tis)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        Ground {
            sim,
            dir,
            nats,
            target,
            db,
        }
    }
}

/// Plays one round with the `podstream` at `binary`.
///
/// # Panics
/// When the database does not end right, or a command was applied twice.
pub async fn play(binary: &Path, kill: Kill) -> Recovery {
    let Ground {
        sim,
        dir,
        nats,
        target,
        db,
    } = Ground::lay(&TASKS, 1).await;
    let kubeconfig = dir.path().join("kubeconfig");

    let url = nats.url();
    let ack_wait = kill.ack_wait_seconds.to_string();
    let start = |args: &[&str]| Component::start(binary, args, &kubeconfig);
    let mut components: Vec<(Stage, Component)> = match kill.stage {
        Stage::Run => vec![(
            Stage::Run,
            start(&[
                "run",
                "--nats",
                &url,
                "--db",
                &target.url,
                "--namespaces",
                NS,
                "--ack-wait-seconds",
                &ack_wait,
            ]),
        )],
        _ => vec![
            (
                Stage::Ingest,
                start(&["ingest", "--nats", &url, "--namespaces", NS]),
            ),
            (
                Stage::Process,
                start(&["process", "--nats", &url, "--ack-wait-seconds", &ack_wait]),
            ),
            (
                Stage::Sink,
                start(&[
                    "sink",
                    "--nats",
                    &url,
                    "--db",
                    &target.url,
                    "--ack-wait-seconds",
                    &ack_wait,
                ]),
            ),
        ],
    };

    let cluster = sim.cluster();
    for task in TASKS {
        cluster
            .create_pod(WorkerPod::new(task, "1", DAG, task, RUN).to_json())
            .unwrap_or_else(|e| panic!("{e}"));
        cluster
            .set_phase(NS, task, "Running")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    wait_for_commands(&db, TASKS.len() as i64).await;

    // A second writer holding SQLite's write lock: the sink's transactions wait on it.
    let mut lock = if kill.lock_database {
        let mut lock = db
            .pool
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("a connection to lock with: {e}"));
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *lock)
            .await
            .unwrap_or_else(|e| panic!("locking the database: {e}"));
        Some(lock)
    } else {
        None
    };
    cluster
        .set_phase(NS, "failed", "Failed")
        .unwrap_or_else(|e| panic!("{e}"));
    if lock.is_some() {
        // Until the sink holds the fail: pulled, waiting on the lock.
        wait_for_ack_pending(&url).await;
    }
    tokio::time::sleep(kill.after).await;
    let killed_at = now();
    let victim = components
        .iter_mut()
        .find(|(stage, _)| *stage == kill.stage)
        .map(|(_, component)| component)
        .unwrap_or_else(|| panic!("no {} component", kill.stage.name()));
    victim.kill();
    cluster
        .set_phase(NS, "failed-later", "Failed")
        .unwrap_or_else(|e| panic!("{e}"));
    cluster
        .relabel(NS, "adopted", "airflow-worker", Some("2"))
        .unwrap_or_else(|e| panic!("{e}"));
    cluster
        .set_phase(NS, "succeeded", "Succeeded")
        .unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(kill.down).await;
    let restarted_at = now();
    victim.restart();
    if let Some(lock) = lock.as_mut() {
        sqlx::query("ROLLBACK")
            .execute(&mut **lock)
            .await
            .unwrap_or_else(|e| panic!("unlocking the database: {e}"));
    }
    drop(lock);

    let expected = [
        ("failed", "up_for_retry", 1),
        ("failed-later", "up_for_retry", 1),
        ("adopted", "running", 2),
        ("succeeded", "running", 1),
        ("running", "running", 1),
    ];
    wait_for_states(&db, &expected).await;
    wait_for_commands(&db, COMMANDS).await;
    let count = |sql: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(sql)
                .fetch_one(&pool)
                .await
                .and_then(|row| row.try_get::<i64, _>(0))
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        }
    };
    assert_eq!(
        count("SELECT COUNT(DISTINCT command_id) FROM podstream_applied").await,
        COMMANDS,
        "every command applied once ({kill:?})"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM log WHERE event = 'podstream_fail'").await,
        2,
        "one fail per failed try ({kill:?})"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM log WHERE event = 'podstream_transfer'").await,
        1,
        "one transfer ({kill:?})"
    );
    let last: f64 = sqlx::query(
        "SELECT (julianday(MAX(applied_at)) - 2440587.5) * 86400.0 FROM podstream_applied",
    )
    .fetch_one(&db.pool)
    .await
    .and_then(|row| row.try_get(0))
    .unwrap_or_else(|e| panic!("last commit: {e}"));
    for (stage, component) in components {
        assert!(
            component.terminate().success(),
            "{} exits 0 on SIGTERM",
            stage.name()
        );
    }
    Recovery {
        from_kill: last - killed_at,
        from_restart: last - restarted_at,
    }
}

/// A burst: `tasks` running task instances whose pods all fail at once; `podstream run` is
/// killed -9 `after` the first half failed, the second half fails while it is down, and it
/// starts again at once, as a container restarts in
/// its pod (`in_pod`: `$POD_NAME` set, the same for both incarnations) or as a process does
/// off Kubernetes (no `$POD_NAME`: a new Lease holder, which waits out the old one's Lease).
#[derive(Debug, Clone, Copy)]
pub struct Burst {
    /// Task instances, each with one pod that fails.
    pub tasks: usize,
    /// How long after the first failure was written the process is killed.
    pub after: Duration,
    /// Whether `$POD_NAME` is set.
    pub in_pod: bool,
}

/// Plays one burst with the `podstream` at `binary`; the seconds from the restart (the new
/// process spawned) until every task instance is `up_for_retry`.
///
/// # Panics
/// When the task instances do not all end `up_for_retry` within 120 s.
pub async fn play_burst(binary: &Path, burst: Burst) -> f64 {
    let names: Vec<String> = (0..burst.tasks).map(|i| format!("burst-{i:03}")).collect();
    let tasks: Vec<&str> = names.iter().map(String::as_str).collect();
    let Ground {
        sim,
        dir,
        nats,
        target,
        db,
    } = Ground::lay(&tasks, 2).await;
    let kubeconfig = dir.path().join("kubeconfig");
    let url = nats.url();
    let env: &[(&str, &str)] = if burst.in_pod {
        &[("POD_NAME", "podstream-run-0")]
    } else {
        &[]
    };
    let mut run = Component::start_with_env(
        binary,
        &[
            "run",
            "--nats",
            &url,
            "--db",
            &target.url,
            "--namespaces",
            NS,
        ],
        &kubeconfig,
        env,
    );
    let cluster = sim.cluster();
    for name in &names {
        cluster
            .create_pod(WorkerPod::new(name, "1", DAG, name, RUN).to_json())
            .unwrap_or_else(|e| panic!("{e}"));
        cluster
            .set_phase(NS, name, "Running")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    wait_for_commands(&db, burst.tasks as i64).await;
    // The first half fails, the process dies in the middle of deciding and applying it, and
    // the second half fails while it is down: whatever the timing, the restarted process
    // has failures to bring in.
    let (first, second) = names.split_at(names.len() / 2);
    for name in first {
        cluster
            .set_phase(NS, name, "Failed")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    tokio::time::sleep(burst.after).await;
    run.kill();
    for name in second {
        cluster
            .set_phase(NS, name, "Failed")
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let restarted = Instant::now();
    run.restart();
    let deadline = restarted + Duration::from_secs(120);
    loop {
        let retried = retried_now(&db).await;
        if retried == burst.tasks as i64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{retried} of {} task instances up for retry ({burst:?})",
            burst.tasks
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = restarted.elapsed().as_secs_f64();
    let status = run.terminate();
    assert!(
        status.success(),
        "podstream run exits 0 on SIGTERM: {status:?} ({burst:?})"
    );
    seconds
}

/// Task instances of the DAG up for retry now (-1 when the query fails).
async fn retried_now(db: &Database) -> i64 {
    sqlx::query("SELECT COUNT(*) FROM task_instance WHERE dag_id = ? AND state = 'up_for_retry'")
        .bind(DAG)
        .fetch_one(&db.pool)
        .await
        .and_then(|row| row.try_get(0))
        .unwrap_or(-1)
}

/// Waits until the sink's consumer has a command delivered and not acked (at most 60 s).
async fn wait_for_ack_pending(url: &str) {
    let js = async_nats::jetstream::new(
        async_nats::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}")),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(stream) = js.get_stream(stream_names::COMMANDS).await
            && let Ok(mut consumer) = stream
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(
                    podstream_sink::service::DEFAULT_CONSUMER,
                )
                .await
            && let Ok(info) = consumer.info().await
            && info.num_ack_pending > 0
        {
            return;
        }
        assert!(Instant::now() < deadline, "the sink never held the fail");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `podstream_applied` holds at least `want` rows (at most 120 s).
async fn wait_for_commands(db: &Database, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let have: i64 = sqlx::query("SELECT COUNT(*) FROM podstream_applied")
            .fetch_one(&db.pool)
            .await
            .and_then(|row| row.try_get(0))
            .unwrap_or(0);
        if have >= want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{have} commands applied, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every (task, state, queued_by_job_id) holds (at most 120 s).
async fn wait_for_states(db: &Database, expected: &[(&str, &str, i64)]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut wrong = Vec::new();
        for (task, state, job) in expected {
            let key = podstream_sink::seed::first_try(DAG, task, RUN);
            let row = db.task_instance(&key).await.ok().flatten();
            if !row
                .as_ref()
                .is_some_and(|r| r.state == *state && r.queued_by_job_id == Some(*job))
            {
                wrong.push(format!("{task}: {row:?}, expected {state} by {job}"));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{wrong:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

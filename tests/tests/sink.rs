//! The sink on real Airflow databases (2.10 and 3.1, SQLite and PostgreSQL, made by Airflow's
//! migrations): every apply rule, exactly once, read back through Airflow itself; and the
//! `podstream sink` service on a real nats-server, across a kill and a PostgreSQL restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_bus::BusConfig;
use std::sync::OnceLock;
use std::time::Duration;

use async_nats::jetstream;
use podstream_proto::subject::stream_names;
use podstream_proto::subject::{Stream, Subjects};
use podstream_proto::v1::command::Kind;
use podstream_proto::v1::{Completed, ContainerTerminated, Duplicate, Fail, Running, Transfer};
use podstream_proto::{Command, PodRef, TaskKey};
use podstream_sink::guard::{Effect, FailState, Policy, Skip, TaskFailures};
use podstream_sink::lanes::LaneConfig;
use podstream_sink::retention::History;
use podstream_sink::service::{self, SinkConfig};
use podstream_sink::{Database, Item, Outcome};
use podstream_tests::airflow::{Airflow, AirflowDb, SeedTi};
use podstream_tests::bus;
use podstream_tests::nats::NatsServer;
use podstream_tests::postgres::PgCluster;
use prost::Message as _;
use sqlx::Row;

const DAG: &str = "etl";
const RUN: &str = "manual__2026-11-30";

const UP_FOR_RETRY: Effect = Effect::Fail {
    state: FailState::UpForRetry,
};
const FAILED: Effect = Effect::Fail {
    state: FailState::Failed,
};

fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(PgCluster::start)
}

fn seed() -> Vec<SeedTi<'static>> {
    let ti = |task_id, map_index, state, try_number, max_tries| SeedTi {
        task_id,
        map_index,
        state,
        try_number,
        max_tries,
    };
    vec![
        ti("retry", -1, Some("running"), 1, 2),
        ti("no_retries", -1, Some("running"), 1, 0),
        ti("last_try", -1, Some("running"), 3, 2),
        ti("done", -1, Some("success"), 1, 2),
        ti("newer", -1, Some("running"), 2, 2),
        ti("mapped", 0, Some("running"), 1, 1),
        ti("mapped", 1, Some("running"), 1, 1),
        ti("moved", -1, Some("queued"), 1, 1),
        ti("watched", -1, Some("running"), 1, 1),
        ti("twins", -1, Some("running"), 1, 1),
        ti("scheduled", -1, Some("scheduled"), 1, 1),
    ]
}

fn key(task_id: &str, map_index: i64, try_number: i64) -> TaskKey {
    TaskKey {
        dag_id: DAG.into(),
        task_id: task_id.into(),
        run_id: RUN.into(),
        map_index,
        try_number,
        ..TaskKey::default()
    }
}

fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "airflow".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

fn command(id: &str, task: TaskKey, kind: Kind) -> Command {
    Command {
        id: id.into(),
        pod: Some(pod(&format!("{}-{}", task.task_id, task.map_index.max(0)))),
        task: Some(task),
        owner: "1".into(),
        resource_version: "42".into(),
        kind: Some(kind),
    }
}

fn fail() -> Kind {
    Kind::Fail(Fail::new(
        "pod_failed".into(),
        "base exited 1".into(),
        vec![],
    ))
}

fn commands() -> Vec<Command> {
    vec![
        command("c1", key("retry", -1, 1), fail()),
        command("c2", key("no_retries", -1, 1), fail()),
        command("c3", key("last_try", -1, 3), fail()),
        command("c4", key("done", -1, 1), fail()),
        command("c5", key("newer", -1, 1), fail()),
        command("c6", key("mapped", 1, 1), fail()),
        command(
            "c7",
            key("moved", -1, 1),
            Kind::Transfer(Transfer {
                from: "1".into(),
                to: "7".into(),
            }),
        ),
        command("c8", key("watched", -1, 1), Kind::Running(Running {})),
        command("c9", key("ghost", -1, 1), fail()),
        command(
            "c10",
            key("twins", -1, 1),
            Kind::Duplicate(Duplicate {
                chosen: Some(pod("twins-a")),
                others: vec![pod("twins-b")],
                ..Duplicate::default()
            }),
        ),
        command("c11", key("scheduled", -1, 1), fail()),
        command("c12", key("done", -1, 1), Kind::Completed(Completed {})),
    ]
}

fn expected_outcomes() -> Vec<Outcome> {
    vec![
        Outcome::Applied(UP_FOR_RETRY),
        Outcome::Applied(FAILED),
        Outcome::Applied(FAILED),
        Outcome::Skipped(Skip::Terminal("success".into())),
        Outcome::Skipped(Skip::NewerTry),
        Outcome::Applied(UP_FOR_RETRY),
        Outcome::Applied(Effect::Transfer { job_id: 7 }),
        Outcome::Applied(Effect::Record),
        Outcome::Skipped(Skip::UnknownTi),
        Outcome::Applied(Effect::Record),
        Outcome::Skipped(Skip::NotAdoptable("scheduled".into())),
        Outcome::Skipped(Skip::Terminal("success".into())),
    ]
}

fn expected_states() -> Vec<(String, i64, String)> {
    [
        ("done", -1, "success"),
        ("last_try", -1, "failed"),
        ("mapped", 0, "running"),
        ("mapped", 1, "up_for_retry"),
        ("moved", -1, "queued"),
        ("newer", -1, "running"),
        ("no_retries", -1, "failed"),
        ("retry", -1, "up_for_retry"),
        ("scheduled", -1, "scheduled"),
        ("twins", -1, "running"),
        ("watched", -1, "running"),
    ]
    .iter()
    .map(|(t, m, s)| (t.to_string(), *m, s.to_string()))
    .collect()
}

/// Commands as the sink takes them, without stream sequences.
fn items(commands: Vec<Command>) -> Vec<Item> {
    commands
        .into_iter()
        .map(|command| Item {
            command,
            sequence: None,
        })
        .collect()
}

async fn prepared(airflow: Airflow, postgres: bool, name: &str) -> (AirflowDb, Database) {
    podstream_tests::init_tracing();
    let target = if postgres {
        AirflowDb::postgres(airflow, cluster(), name)
    } else {
        AirflowDb::sqlite(airflow)
    };
    let db = Database::connect(&target.url).await.unwrap();
    for statement in target.seed_sql(DAG, RUN, &seed()) {
        sqlx::query(&statement)
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("seeding: {e}\n{statement}"));
    }
    (target, db)
}

async fn states(db: &Database) -> Vec<(String, i64, String)> {
    sqlx::query("SELECT task_id, CAST(map_index AS BIGINT), state FROM task_instance ORDER BY task_id, map_index")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get::<String, _>(0), row.get::<i64, _>(1), row.get::<Option<String>, _>(2).unwrap_or_default()))
        .collect()
}

async fn count(db: &Database, sql: &str) -> i64 {
    sqlx::query(sql)
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

async fn every_rule(airflow: Airflow, postgres: bool, name: &str) {
    let (target, db) = prepared(airflow, postgres, name).await;
    let items = items(commands());
    let outcomes = db.apply_batch(&items).await.unwrap();
    assert_eq!(outcomes, expected_outcomes(), "{name}");
    assert_eq!(states(&db).await, expected_states(), "{name}");

    let (job, external): (i64, String) = {
        let row = sqlx::query("SELECT CAST(queued_by_job_id AS BIGINT), external_executor_id FROM task_instance WHERE task_id = 'moved'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((job, external.as_str()), (7, "7"), "{name}: transfer");
    let ended = count(&db, "SELECT CAST(COUNT(*) AS BIGINT) FROM task_instance WHERE end_date IS NOT NULL AND duration IS NOT NULL").await;
    assert_eq!(
        ended, 4,
        "{name}: end_date and duration on the four failed TIs"
    );
    let logs = "SELECT CAST(COUNT(*) AS BIGINT) FROM log WHERE event LIKE 'podstream%'";
    assert_eq!(
        count(&db, logs).await,
        5,
        "{name}: four fails and a transfer in Airflow's log"
    );
    let reason =
        sqlx::query("SELECT extra FROM log WHERE event = 'podstream_fail' AND task_id = 'retry'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        reason.get::<String, _>(0).contains("pod_failed"),
        "{name}: the reason in extra"
    );
    let duplicates = count(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_duplicate WHERE other_uid = 'uid-twins-b'",
    )
    .await;
    assert_eq!(duplicates, 1, "{name}: duplicate recorded");
    let current = count(&db, "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_ti_pod").await;
    assert_eq!(
        current, 7,
        "{name}: current pod of every TI a command applied to"
    );

    // Applying it all again changes nothing, log rows included.
    let again = db.apply_batch(&items).await.unwrap();
    assert!(
        again
            .iter()
            .all(|o| *o == Outcome::Skipped(Skip::AlreadyApplied)),
        "{name}: {again:?}"
    );
    assert_eq!(states(&db).await, expected_states());
    assert_eq!(count(&db, logs).await, 5, "{name}: no second log row");

    // Airflow reads what the sink wrote.
    let through_airflow = target.states_through_airflow(DAG);
    assert_eq!(
        through_airflow,
        expected_states(),
        "{name}: as Airflow's ORM sees it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_on_every_airflow_on_sqlite() {
    for airflow in Airflow::all() {
        every_rule(
            airflow,
            false,
            &format!("a{}_sqlite", airflow.short().replace('.', "")),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_on_every_airflow_on_postgres() {
    for airflow in Airflow::all() {
        every_rule(
            airflow,
            true,
            &format!("a{}_pg", airflow.short().replace('.', "")),
        )
        .await;
    }
}

/// A fail with `reason` and, when given, the container that ended with `terminated`.
fn fail_with(reason: &str, terminated: Option<&str>) -> Kind {
    let terminated = terminated.map(|reason| ContainerTerminated {
        container: "base".into(),
        exit_code: 1,
        reason: reason.into(),
    });
    Kind::Fail(Fail::new(
        reason.into(),
        String::new(),
        terminated.into_iter().collect(),
    ))
}

/// A pod that fails while its TI is still `queued` failed before the task process started:
/// the sink records `launch_failed` and leaves the TI to the executor's relaunch, unless the
/// container's reason is excluded (`Error` by default, as in Airflow). A running TI fails as
/// ever. On Airflow 3, a pod naming a TI UUID moves only the TI with that id; on Airflow 2, a
/// pod naming one moves nothing.
async fn pre_execution_failures_and_ti_uuids(airflow: Airflow, postgres: bool, name: &str) {
    let (target, db) = prepared(airflow, postgres, name).await;
    let ti = |task_id, state, max_tries| SeedTi {
        task_id,
        map_index: -1,
        state: Some(state),
        try_number: 1,
        max_tries,
    };
    let dag = "launch";
    let seeded = [
        ti("queued_deleted", "queued", 0),
        ti("queued_error", "queued", 0),
        ti("queued_pull", "queued", 1),
        ti("queued_pull_excluded", "queued", 0),
        ti("running_deleted", "running", 1),
        ti("running_last", "running", 0),
        ti("by_id", "running", 1),
        ti("other_id", "running", 1),
    ];
    for statement in target.seed_sql(dag, RUN, &seeded) {
        sqlx::query(&statement).execute(&db.pool).await.unwrap();
    }
    let at = |task_id: &str| TaskKey {
        dag_id: dag.into(),
        ..key(task_id, -1, 1)
    };
    let stored_id = db.task_instance(&at("by_id")).await.unwrap().unwrap().id;
    assert_eq!(
        stored_id.is_some(),
        airflow.is_3(),
        "{name}: task_instance.id"
    );
    let with_id = |task_id: &str, id: &str| TaskKey {
        task_instance_id: id.into(),
        ..at(task_id)
    };
    let deleted = || fail_with("deleted_while_running", None);
    let mut cases = vec![
        (
            command("l1", at("queued_deleted"), deleted()),
            Outcome::Applied(Effect::LaunchFailed),
            "queued",
        ),
        (
            command(
                "l2",
                at("queued_error"),
                fail_with("pod_failed", Some("Error")),
            ),
            Outcome::Applied(FAILED),
            "failed",
        ),
        (
            command(
                "l3",
                at("queued_pull"),
                fail_with("fatal_pending:ErrImagePull", None),
            ),
            Outcome::Applied(Effect::LaunchFailed),
            "queued",
        ),
        (
            command("l4", at("running_deleted"), deleted()),
            Outcome::Applied(UP_FOR_RETRY),
            "up_for_retry",
        ),
        (
            command("l5", at("running_last"), deleted()),
            Outcome::Applied(FAILED),
            "failed",
        ),
    ];
    let other = "0196b3a0-1c2d-7e3f-8a4b-5c6d7e8f9a0b";
    if stored_id.is_none() {
        // Airflow 2 keys TIs by name: a pod that claims a UUID is no pod of Airflow's.
        cases.push((
            command("l6", with_id("by_id", other), deleted()),
            Outcome::Skipped(Skip::ForeignPod),
            "running",
        ));
    }
    if let Some(id) = &stored_id {
        cases.push((
            command("l6", with_id("by_id", id), deleted()),
            Outcome::Applied(UP_FOR_RETRY),
            "up_for_retry",
        ));
        cases.push((
            command("l7", with_id("other_id", other), deleted()),
            Outcome::Skipped(Skip::ForeignPod),
            "running",
        ));
    }
    let (commands, outcomes): (Vec<Command>, Vec<Outcome>) =
        cases.iter().map(|(c, o, _)| (c.clone(), o.clone())).unzip();
    assert_eq!(
        db.apply_batch(&items(commands)).await.unwrap(),
        outcomes,
        "{name}"
    );

    // An operator who excludes image pulls too (as Airflow's option can): that fails at once.
    let strict = Database::connect(&target.url).await.unwrap().with_policy(
        Policy::with_launch_failure_excluded_reasons(" Error, ErrImagePull "),
    );
    let pull = command(
        "l8",
        at("queued_pull_excluded"),
        fail_with("fatal_pending:ErrImagePull", None),
    );
    assert_eq!(
        strict.apply_batch(&items(vec![pull])).await.unwrap(),
        vec![Outcome::Applied(FAILED)],
        "{name}"
    );
    drop(strict);

    for (command, _, state) in &cases {
        let task = command.task.as_ref().unwrap();
        let row = db.task_instance(task).await.unwrap().unwrap();
        assert_eq!(row.state, *state, "{name}: {}", task.task_id);
    }
    let launch_logs = count(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM log WHERE event = 'podstream_launch_failed'",
    )
    .await;
    assert_eq!(
        launch_logs, 2,
        "{name}: each launch failure in Airflow's log"
    );
    let extra: String = sqlx::query(
        "SELECT extra FROM log WHERE event = 'podstream_launch_failed' AND task_id = 'queued_pull'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0);
    assert!(
        extra.contains("\"container_reason\":\"ErrImagePull\""),
        "{name}: {extra}"
    );
    let recorded = count(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied WHERE outcome = 'launch_failed'",
    )
    .await;
    assert_eq!(recorded, 2, "{name}: recorded in podstream_applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_execution_failures_and_ti_uuids_on_every_airflow_on_sqlite() {
    for airflow in Airflow::all() {
        let name = format!("l{}_sqlite", airflow.short().replace('.', ""));
        pre_execution_failures_and_ti_uuids(airflow, false, &name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_execution_failures_and_ti_uuids_on_every_airflow_on_postgres() {
    for airflow in Airflow::all() {
        let name = format!("l{}_pg", airflow.short().replace('.', ""));
        pre_execution_failures_and_ti_uuids(airflow, true, &name).await;
    }
}

/// Applies `items` through `lanes` lanes, in small batches so a lane commits several.
async fn through_lanes(db: &Database, items: &[Item], lanes: usize) -> Vec<Outcome> {
    let config = LaneConfig {
        lanes,
        batch_size: 4,
        batch_wait: Duration::ZERO,
        health: podstream_bus::Health::new(),
    };
    podstream_tests::sink::through_lanes(db, items, config).await
}

/// `podstream sink` applies over parallel lanes, one transaction at a time each, a TI always
/// in the same lane: the result is the batch's, and a TI's commands keep their order (a TI
/// transferred, then failed by a container that ended with `Error`, which fails even a queued
/// TI: the other way round, the transfer would find the TI no longer adoptable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_over_parallel_lanes_apply_as_one_batch_in_each_tis_order() {
    let (_target, db) = prepared(Airflow::line("2.10"), true, "split").await;
    let mut commands = commands();
    commands.push(command(
        "c13",
        key("moved", -1, 1),
        fail_with("pod_failed", Some("Error")),
    ));
    let items = items(commands);
    let outcomes = through_lanes(&db, &items, 3).await;
    let mut expected = expected_outcomes();
    expected.push(Outcome::Applied(UP_FOR_RETRY));
    assert_eq!(outcomes, expected);
    let states = states(&db).await;
    let moved = states.iter().find(|(task, _, _)| task == "moved");
    assert_eq!(
        moved.map(|(_, _, state)| state.as_str()),
        Some("up_for_retry"),
        "moved: transferred, then failed with a retry left"
    );
    let job: i64 = sqlx::query(
        "SELECT CAST(queued_by_job_id AS BIGINT) FROM task_instance WHERE task_id = 'moved'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get(0);
    assert_eq!(job, 7, "the transfer applied before the fail");

    // Again over other lanes: every command is already applied.
    let again = through_lanes(&db, &items, 2).await;
    assert!(
        again
            .iter()
            .all(|o| *o == Outcome::Skipped(Skip::AlreadyApplied)),
        "{again:?}"
    );
}

/// A newer Airflow than the list: its revision is unknown, so its columns decide. Every
/// column the sink writes there: it goes on (with a warning naming the revision); one missing:
/// refused, with the revision in the error.
async fn unknown_revision_is_judged_by_its_columns(postgres: bool) {
    for airflow in [Airflow::oldest(), Airflow::newest()] {
        let name = format!("newer{}", airflow.short().replace('.', ""));
        let (target, db) = prepared(airflow, postgres, &name).await;
        sqlx::query("UPDATE alembic_version SET version_num = 'deadbeef0000'")
            .execute(&db.pool)
            .await
            .unwrap();
        db.pool.close().await;
        let newer = Database::connect(&target.url).await.unwrap();
        assert_eq!(newer.release, None);
        assert_eq!(newer.airflow, airflow.0.schema(), "{name}");
        sqlx::query("ALTER TABLE task_instance DROP COLUMN external_executor_id")
            .execute(&newer.pool)
            .await
            .unwrap();
        newer.pool.close().await;
        let error = Database::connect(&target.url).await.unwrap_err();
        assert!(format!("{error:#}").contains("deadbeef0000"), "{error:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_revision_is_judged_by_its_columns_on_sqlite() {
    unknown_revision_is_judged_by_its_columns(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_revision_is_judged_by_its_columns_on_postgres() {
    unknown_revision_is_judged_by_its_columns(true).await;
}

async fn publish(js: &jetstream::Context, commands: &[Command]) {
    for command in commands {
        let uid = command.pod.as_ref().map_or("none", |p| p.uid.as_str());
        let ack = js
            .send_publish(
                format!("podstream.commands.{}.{uid}", command.owner),
                jetstream::message::PublishMessage::build()
                    .payload(command.encode_to_vec().into())
                    .message_id(&command.id),
            )
            .await
            .unwrap();
        ack.await.unwrap();
    }
}

async fn ensure_streams(js: &jetstream::Context) {
    let settings = podstream_bus::StreamSettings::default();
    podstream_bus::streams::ensure(
        js,
        podstream_bus::streams::stream_config(&Subjects::default(), Stream::Commands, &settings),
    )
    .await
    .unwrap();
    podstream_bus::streams::ensure(
        js,
        podstream_bus::streams::stream_config(&Subjects::default(), Stream::DeadLetters, &settings),
    )
    .await
    .unwrap();
}

fn start_sink(
    nats: &str,
    db: Database,
) -> (
    tokio::task::JoinHandle<podstream_sink::summary::Summary>,
    tokio::sync::oneshot::Sender<()>,
) {
    start_sink_with(
        SinkConfig {
            bus: BusConfig::at(nats),
            ..SinkConfig::default()
        },
        db,
    )
}

fn start_sink_with(
    config: SinkConfig,
    db: Database,
) -> (
    tokio::task::JoinHandle<podstream_sink::summary::Summary>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        service::run(config, db, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap()
    });
    (task, stop)
}

/// Where the schedulers run PodstreamKubernetesExecutor (its consumer says so), a sink that
/// would fail task instances itself refuses to start; one started with `--task-failures
/// executor` records each fail and leaves the TI to the executor, and applies transfers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beside_executors_that_fail_tasks_the_sink_only_records_fails() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let stream = js.get_stream(stream_names::COMMANDS).await.unwrap();
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("podstream-airflow-7".into()),
            filter_subject: "podstream.commands.7.*".into(),
            metadata: [(
                service::TASK_FAILURES_METADATA.to_owned(),
                "executor".to_owned(),
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let (_target, db) = prepared(Airflow::line("3.1"), false, "modes").await;

    let sink_mode = service::run(
        SinkConfig {
            bus: BusConfig::at(&nats.url()),
            ..SinkConfig::default()
        },
        db.clone(),
        std::future::pending(),
    );
    let refused = tokio::time::timeout(Duration::from_secs(30), sink_mode)
        .await
        .expect("the sink refuses at once, it does not run")
        .expect_err("a sink that fails TIs beside executors that do");
    let message = format!("{refused:#}");
    assert!(
        message.contains("podstream-airflow-7") && message.contains("--task-failures executor"),
        "{message}"
    );

    let db = db.with_policy(Policy::default().with_task_failures(TaskFailures::Executor));
    publish(
        &js,
        &[
            command("e1", key("retry", -1, 1), fail()),
            command(
                "e2",
                key("moved", -1, 1),
                Kind::Transfer(Transfer {
                    from: "1".into(),
                    to: "7".into(),
                }),
            ),
        ],
    )
    .await;
    let (task, stop) = start_sink(&nats.url(), db.clone());
    wait_for(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied WHERE command_id IN ('e1', 'e2')",
        2,
    )
    .await;
    let _ = stop.send(());
    let summary = task.await.unwrap();
    assert_eq!(summary.applied, 2, "{summary}");
    let retry = db
        .task_instance(&key("retry", -1, 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        retry.state, "running",
        "the fail is the executor's to apply"
    );
    let moved = db
        .task_instance(&key("moved", -1, 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved.queued_by_job_id, Some(7), "transfers still apply");
    let outcome: String =
        sqlx::query("SELECT outcome FROM podstream_applied WHERE command_id = 'e1'")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            .get(0);
    assert_eq!(outcome, "left_to_executor");
}

async fn wait_for(db: &Database, sql: &str, want: i64) {
    let started = std::time::Instant::now();
    loop {
        if count(db, sql).await >= want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "timed out waiting for {sql} = {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sink_service_applies_once_across_a_crash_between_commit_and_ack() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let (_target, db) = prepared(Airflow::line("2.10"), false, "svc").await;

    // A sink committed these but died before acking: the effects are in, the acks are not.
    let items = items(commands());
    db.apply_batch(&items).await.unwrap();
    let logs = "SELECT CAST(COUNT(*) AS BIGINT) FROM log WHERE event LIKE 'podstream%'";
    assert_eq!(count(&db, logs).await, 5);

    // So they are all delivered again, plus a poisoned message and a command the DB can't take.
    publish(&js, &commands()).await;
    js.publish(
        "podstream.commands.1.garbage",
        bytes::Bytes::from_static(b"\xff\xffnot protobuf"),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let bad = command(
        "c-bad",
        key("watched", -1, 1),
        Kind::Transfer(Transfer {
            from: "1".into(),
            to: "scheduler-b".into(),
        }),
    );
    // A transfer's copy for its previous owner (the processor's `left` notice): for that
    // scheduler's executor; the sink applies the transfer from the other copy only.
    let copy = command(
        "c-left",
        key("watched", -1, 1),
        Kind::Transfer(Transfer {
            from: "1".into(),
            to: "2".into(),
        }),
    );
    js.send_publish(
        "podstream.commands.1.uid-watched",
        jetstream::message::PublishMessage::build()
            .headers(podstream_bus::role::headers(
                podstream_proto::subject::Role::Left,
            ))
            .payload(copy.encode_to_vec().into()),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let fresh = command("c-fresh", key("twins", -1, 1), fail());
    publish(&js, &[bad, fresh]).await;
    // An id applied longer ago than the default retention (the stream's week and a day):
    // the sink prunes it when it starts.
    sqlx::query(
        "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at)
         VALUES ('c-ancient', 0, 'recorded', strftime('%Y-%m-%d %H:%M:%f', 'now', '-9 days'))",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    let (task, stop) = start_sink(&nats.url(), db.clone());
    wait_for(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied WHERE command_id = 'c-fresh'",
        1,
    )
    .await;
    let ancient =
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied WHERE command_id = 'c-ancient'";
    let started = std::time::Instant::now();
    while count(&db, ancient).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the old id was never pruned"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bus::settle(
        &js,
        stream_names::DEAD,
        2,
        Duration::from_millis(200),
        Duration::from_secs(30),
    )
    .await;
    let _ = stop.send(());
    let summary = task.await.unwrap();

    assert_eq!(
        summary.skipped.get("already_applied"),
        Some(&12),
        "{summary}"
    );
    assert_eq!(
        summary.applied, 1,
        "{summary}: the left copy is not applied"
    );
    let left = "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied WHERE command_id = 'c-left'";
    assert_eq!(count(&db, left).await, 0);
    assert_eq!(summary.dead_lettered, 2, "{summary}");
    assert_eq!(
        count(&db, logs).await,
        6,
        "only the fresh fail added a log row"
    );
    let dead = bus::read_all(&js, stream_names::DEAD).await;
    assert!(
        dead.iter()
            .all(|d| d.subject == "podstream.dead.sink" && d.header("Podstream-Reason").is_some())
    );
    assert!(dead.iter().any(|d| {
        d.header("Podstream-Reason")
            .unwrap()
            .contains("integer job id")
    }));
}

/// Three sinks share the consumer and pull one command at a time, so a TI's two transfers
/// (1→2, then 2→3) are applied by different sinks at once: every TI still ends with owner 3,
/// each transfer applied or skipped once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_sinks_apply_each_tis_transfers_in_stream_order() {
    const TIS: usize = 1_000;
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let (_target, db) = prepared(Airflow::line("3.1"), true, "orders").await;
    let (dag, run) = ("orders", RUN);
    let names: Vec<String> = (0..TIS).map(|i| format!("moving_{i}")).collect();
    let tis: Vec<SeedTi<'_>> = names.iter().map(|t| SeedTi::running(t, 1)).collect();
    db.seed(dag, run, &tis).await.unwrap();
    let transfer = |task: &str, from: &str, to: &str| {
        let task = TaskKey {
            dag_id: dag.into(),
            ..key(task, -1, 1)
        };
        Command {
            id: format!("{}:{from}-{to}", task.task_id),
            owner: to.into(),
            ..command(
                "",
                task,
                Kind::Transfer(Transfer {
                    from: from.into(),
                    to: to.into(),
                }),
            )
        }
    };
    let commands: Vec<Command> = names
        .iter()
        .flat_map(|t| [transfer(t, "1", "2"), transfer(t, "2", "3")])
        .collect();
    publish(&js, &commands).await;
    let sinks: Vec<_> = (0..3)
        .map(|_| {
            start_sink_with(
                SinkConfig {
                    bus: BusConfig::at(&nats.url()),
                    batch_size: 1,
                    ..SinkConfig::default()
                },
                db.clone(),
            )
        })
        .collect();
    let all = commands.len() as i64;
    let seen =
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied WHERE command_id LIKE 'moving%'";
    wait_for(&db, seen, all).await;
    let mut summaries = Vec::new();
    for (task, stop) in sinks {
        let _ = stop.send(());
        summaries.push(task.await.unwrap());
    }
    let owners: Vec<(String, Option<i64>)> = sqlx::query(&format!(
        "SELECT task_id, CAST(queued_by_job_id AS BIGINT) FROM task_instance WHERE dag_id = '{dag}'"
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect();
    assert_eq!(owners.len(), TIS);
    let wrong: Vec<_> = owners
        .iter()
        .filter(|(_, owner)| *owner != Some(3))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} TIs not with owner 3, e.g. {:?}; {summaries:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert!(
        summaries.iter().all(|s| s.applied > 0),
        "all three sinks took part: {summaries:?}"
    );
    assert_eq!(
        count(&db, "SELECT CAST(COUNT(DISTINCT command_id) AS BIGINT) FROM podstream_applied WHERE command_id LIKE 'moving%'").await,
        all
    );
}

/// The sink's consumer, once a starting sink has made it.
async fn sink_consumer(js: &jetstream::Context) -> jetstream::consumer::PullConsumer {
    let stream = js.get_stream(stream_names::COMMANDS).await.unwrap();
    loop {
        if let Ok(consumer) = stream.get_consumer(service::DEFAULT_CONSUMER).await {
            return consumer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A database slower than the ack wait (a lock held for four of them): the sink keeps the
/// commands it holds with progress acks, so none is redelivered, and each applies once when
/// the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_slower_than_the_ack_wait_causes_no_redelivery() {
    use sqlx::Connection as _;
    const ACK_WAIT: Duration = Duration::from_secs(1);
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let (target, db) = prepared(Airflow::line("3.1"), true, "slow").await;
    let mut locker = sqlx::PgConnection::connect(&target.url).await.unwrap();
    let mut lock = locker.begin().await.unwrap();
    sqlx::query("LOCK TABLE task_instance IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();

    let (task, stop) = start_sink_with(
        SinkConfig {
            bus: BusConfig::at(&nats.url()),
            ack_wait: ACK_WAIT,
            ..SinkConfig::default()
        },
        db.clone(),
    );
    publish(&js, &commands()).await;
    let mut consumer = sink_consumer(&js).await;
    tokio::time::sleep(4 * ACK_WAIT).await;
    let held = consumer.info().await.unwrap().clone();
    assert_eq!(
        held.num_ack_pending,
        commands().len(),
        "the sink holds every command while the table is locked: {held:?}"
    );
    assert_eq!(held.num_redelivered, 0, "{held:?}");
    lock.rollback().await.unwrap();

    let all = commands().len() as i64;
    wait_for(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied",
        all,
    )
    .await;
    let _ = stop.send(());
    let summary = task.await.unwrap();
    let after = consumer.info().await.unwrap().clone();
    assert_eq!(
        after.delivered.consumer_sequence,
        commands().len() as u64,
        "each command was delivered once: {after:?}"
    );
    assert_eq!(after.num_ack_pending, 0, "{after:?}");
    assert_eq!(
        count(
            &db,
            "SELECT CAST(COUNT(DISTINCT command_id) AS BIGINT) FROM podstream_applied"
        )
        .await,
        all
    );
    assert_eq!(summary.skipped.get("already_applied"), None, "{summary}");
    assert_eq!(states(&db).await, expected_states());
}

/// While the database refuses: nothing is dead-lettered, and the sink holds every command
/// unacked.
async fn every_command_held(
    js: &jetstream::Context,
    consumer: &mut jetstream::consumer::PullConsumer,
    what: &str,
) {
    let dead = js
        .get_stream(stream_names::DEAD)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(dead, 0, "{what}: nothing is dead-lettered");
    let info = consumer.info().await.unwrap().clone();
    assert_eq!(
        info.num_ack_pending,
        commands().len(),
        "{what}: nothing is acked: {info:?}"
    );
}

/// A database that refuses every write (a renamed column, a privilege revoked, then a
/// failover onto a read-only server) is an outage, not bad commands: while it lasts nothing
/// is dead-lettered, acked or applied, and when it is undone every command applies once. The
/// sink connects as a role of its own, as in production (a superuser ignores privileges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_refuses_every_write_loses_no_command() {
    use sqlx::Connection as _;
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let (target, db) = prepared(Airflow::line("3.1"), true, "refusing").await;
    let mut admin = sqlx::PgConnection::connect(&target.url).await.unwrap();
    let run = |sql: &'static str| sqlx::query(sql);
    for grant in [
        "CREATE ROLE podstream_sink LOGIN",
        "GRANT CREATE, USAGE ON SCHEMA public TO podstream_sink",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO podstream_sink",
        "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO podstream_sink",
    ] {
        run(grant).execute(&mut admin).await.unwrap();
    }
    let as_sink = target.url.replacen("postgres@", "podstream_sink@", 1);
    let sink_db = Database::connect(&as_sink).await.unwrap();
    let (task, stop) = start_sink(&nats.url(), sink_db);
    let mut consumer = sink_consumer(&js).await;

    run("ALTER TABLE task_instance RENAME COLUMN state TO state_gone")
        .execute(&mut admin)
        .await
        .unwrap();
    publish(&js, &commands()).await;
    let refused = |what: &'static str| {
        let js = js.clone();
        let db = db.clone();
        let mut consumer = consumer.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            every_command_held(&js, &mut consumer, what).await;
            let applied = count(
                &db,
                "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied",
            )
            .await;
            assert_eq!(applied, 0, "{what}: nothing is applied");
        }
    };
    refused("a column gone").await;

    // The sink's privilege to update task instances revoked (42501), then the column back:
    // each fault starts before the last one ends, so no retry can slip between them.
    run("REVOKE UPDATE ON task_instance FROM podstream_sink")
        .execute(&mut admin)
        .await
        .unwrap();
    run("ALTER TABLE task_instance RENAME COLUMN state_gone TO state")
        .execute(&mut admin)
        .await
        .unwrap();
    refused("a privilege revoked").await;

    // A failover onto a read-only server (every session from now on is read-only), then the
    // privilege back.
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let end_sessions = "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()";
    sqlx::query(&format!(
        "ALTER DATABASE \"{database}\" SET default_transaction_read_only = on"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::query(end_sessions).execute(&mut admin).await.unwrap();
    run("GRANT UPDATE ON task_instance TO podstream_sink")
        .execute(&mut admin)
        .await
        .unwrap();
    refused("a read-only database").await;

    sqlx::query(&format!(
        "ALTER DATABASE \"{database}\" RESET default_transaction_read_only"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    sqlx::query(end_sessions).execute(&mut admin).await.unwrap();
    let all = commands().len() as i64;
    wait_for(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied",
        all,
    )
    .await;
    let _ = stop.send(());
    let summary = task.await.unwrap();
    assert_eq!(summary.dead_lettered, 0, "{summary}");
    assert_eq!(states(&db).await, expected_states());
    assert_eq!(
        count(
            &db,
            "SELECT CAST(COUNT(DISTINCT command_id) AS BIGINT) FROM podstream_applied"
        )
        .await,
        all
    );
    assert_eq!(consumer.info().await.unwrap().num_ack_pending, 0);
}

/// A SQLite file the sink may only read (a file left read-only after a restore, a volume
/// mounted read-only) is an outage too: nothing is dead-lettered or acked while it lasts, and
/// once the file is writable again every command applies once, over a fresh connection (one
/// opened read-only stays so). `podstream sink` runs as `nobody` when the tests run as root,
/// who ignores a file's mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_sqlite_file_loses_no_command() {
    use std::os::unix::fs::{PermissionsExt as _, chown};
    use std::os::unix::process::CommandExt as _;
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let (target, db) = prepared(Airflow::line("3.1"), false, "read-only").await;
    db.pool.close().await;
    let path = std::path::PathBuf::from(target.url.trim_start_matches("sqlite://"));
    let id = |args: &[&str]| -> u32 {
        let output = std::process::Command::new("id")
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap()
    };
    // Root ignores a file's mode: as root, the sink runs as `nobody`, owning the files.
    let (user, group) = if id(&["-u"]) == 0 {
        (id(&["-u", "nobody"]), id(&["-g", "nobody"]))
    } else {
        (id(&["-u"]), id(&["-g"]))
    };
    let dir = path.parent().unwrap();
    chown(dir, Some(user), Some(group)).unwrap();
    for file in std::fs::read_dir(dir).unwrap() {
        chown(file.unwrap().path(), Some(user), Some(group)).unwrap();
    }
    // The database's files, as an operator's `chmod 444 airflow.db*` sets them (SQLite makes
    // its -wal and -shm files with the database file's mode).
    let mode = |bits| {
        for file in std::fs::read_dir(dir).unwrap() {
            let file = file.unwrap().path();
            if file.to_string_lossy().starts_with(&*path.to_string_lossy()) {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(bits)).unwrap();
            }
        }
    };
    mode(0o444);
    let mut sink = std::process::Command::new(podstream_tests::podstream_binary())
        .args(["sink", "--nats", &nats.url(), "--db", &target.url])
        .uid(user)
        .gid(group)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("sink.err")).unwrap())
        .spawn()
        .unwrap();
    let mut consumer = sink_consumer(&js).await;
    publish(&js, &commands()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let logged = || std::fs::read_to_string(dir.join("sink.err")).unwrap_or_default();
    assert!(sink.try_wait().unwrap().is_none(), "{}", logged());
    every_command_held(&js, &mut consumer, "a read-only file").await;
    assert!(logged().contains("readonly"), "{}", logged());

    // Once writable, everything is applied and then acked. (The database is read here only
    // after the sink stops: a root connection would leave WAL files `nobody` cannot write.)
    mode(0o644);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while consumer.info().await.unwrap().num_ack_pending > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "not applied once writable: {}",
            logged()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::process::Command::new("kill")
        .args(["-TERM", &sink.id().to_string()])
        .status()
        .unwrap();
    assert!(sink.wait().unwrap().success(), "{}", logged());
    assert!(logged().contains(", dead-lettered 0"), "{}", logged());
    let db = Database::connect(&target.url).await.unwrap();
    assert_eq!(
        count(
            &db,
            "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied"
        )
        .await,
        commands().len() as i64
    );
    assert_eq!(states(&db).await, expected_states());
}

/// SIGTERM while the database is down and commands are held: the sink cannot drain, and
/// exits (code 1) once --shutdown-timeout-seconds have passed rather than hanging; what it
/// held is still in the stream, unacked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_the_database_down_exits_within_the_shutdown_timeout() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let pg = PgCluster::start();
    let target = AirflowDb::postgres(Airflow::line("3.1"), &pg, "stopping");
    let dir = tempfile::tempdir().unwrap();
    let sink = podstream_tests::component::Component::start(
        podstream_tests::podstream_binary(),
        &[
            "sink",
            "--nats",
            &nats.url(),
            "--db",
            &target.url,
            "--shutdown-timeout-seconds",
            "2",
        ],
        &dir.path().join("no-kubeconfig"),
    );
    let mut consumer = sink_consumer(&js).await;
    pg.stop();
    publish(&js, &commands()).await;
    while consumer.info().await.unwrap().num_ack_pending < commands().len() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = sink.terminate();
    assert_eq!(status.code(), Some(1), "a drain cut short is an error exit");
    let info = consumer.info().await.unwrap().clone();
    assert_eq!(
        info.ack_floor.stream_sequence, 0,
        "nothing was acked: {info:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_stream_loses_nothing_and_doubles_nothing() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let pg = PgCluster::start();
    let target = AirflowDb::postgres(Airflow::line("3.1"), &pg, "restart");
    let db = Database::connect(&target.url).await.unwrap();
    let tis: Vec<SeedTi> = (0..300)
        .map(|i| SeedTi {
            task_id: Box::leak(format!("t{i:03}").into_boxed_str()),
            map_index: -1,
            state: Some("running"),
            try_number: 1,
            max_tries: 1,
        })
        .collect();
    for statement in target.seed_sql(DAG, RUN, &tis) {
        sqlx::query(&statement).execute(&db.pool).await.unwrap();
    }
    let all: Vec<Command> = (0..300)
        .map(|i| command(&format!("f{i:03}"), key(&format!("t{i:03}"), -1, 1), fail()))
        .collect();
    let (task, stop) = start_sink(&nats.url(), db.clone());
    publish(&js, &all[..150]).await;
    wait_for(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied",
        50,
    )
    .await;
    pg.restart();
    publish(&js, &all[150..]).await;
    wait_for(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied",
        300,
    )
    .await;
    let _ = stop.send(());
    task.await.unwrap();
    let retried = count(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM task_instance WHERE state = 'up_for_retry'",
    )
    .await;
    assert_eq!(retried, 300, "every fail applied");
    let logs = count(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM log WHERE event = 'podstream_fail'",
    )
    .await;
    assert_eq!(logs, 300, "and none twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_database_refuses_is_dead_and_the_rest_of_its_batch_applies() {
    let (_target, db) = prepared(Airflow::line("3.1"), true, "poison").await;
    let mut poisoned = command("p1", key("watched", -1, 1), Kind::Running(Running {}));
    // Longer than podstream_ti_pod.pod_name allows: PostgreSQL refuses the row.
    poisoned.pod.as_mut().unwrap().name = "x".repeat(300);
    let items = items(vec![
        command("p0", key("retry", -1, 1), fail()),
        poisoned,
        command("p2", key("no_retries", -1, 1), fail()),
    ]);
    let outcomes = db.apply_batch(&items).await.unwrap();
    assert_eq!(outcomes[0], Outcome::Applied(UP_FOR_RETRY));
    assert!(
        matches!(&outcomes[1], Outcome::Dead(reason) if reason.contains("refused")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[2], Outcome::Applied(FAILED));
    let applied = count(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied",
    )
    .await;
    assert_eq!(applied, 2, "the refused command is not recorded as applied");
}

/// SQLite plans without statistics, and once walked the state index as the outer loop of the
/// guarded update (every running TI against every row: 34 commands/s). Every set statement
/// must reach `task_instance` and `podstream_applied` through their keys, never a scan.
#[tokio::test]
async fn on_sqlite_every_set_statement_reaches_rows_through_their_keys() {
    for airflow in Airflow::all() {
        let (_target, db) = prepared(airflow, false, "plans").await;
        for (name, text) in db.sql.named() {
            let plan: Vec<String> = sqlx::query(&format!("EXPLAIN QUERY PLAN {text}"))
                .bind("[]")
                .bind("2026-11-30 10:00:00.000000")
                .fetch_all(&db.pool)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .iter()
                .map(|row| row.get::<String, _>(3))
                .collect();
            let scans: Vec<&String> = plan
                .iter()
                .filter(|step| {
                    step.starts_with("SCAN task_instance")
                        || step.starts_with("SCAN podstream_applied")
                        || step.starts_with("SEARCH task_instance USING INDEX ti_state")
                })
                .collect();
            assert!(
                scans.is_empty(),
                "{airflow:?} {name} scans: {plan:#?}\n{text}"
            );
        }
    }
}

/// The applied-id lookup runs on every batch against a table that only grows. PostgreSQL
/// must probe its primary key however the table looked when the connection prepared the
/// statement: plans are made per batch (`plan_cache_mode`), and the lookup's shape leaves
/// no room for a scan once the table has rows.
#[tokio::test]
async fn on_postgres_the_applied_lookup_probes_the_key_as_the_table_grows() {
    let (_target, db) = prepared(Airflow::line("2.10"), true, "applied_plan").await;
    let mut conn = db.pool.acquire().await.unwrap();
    let mode: String = sqlx::query("SHOW plan_cache_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "force_custom_plan");
    let (name, lookup) = db.sql.named()[0];
    assert_eq!(name, "applied_ids");
    sqlx::query(
        "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at)
         SELECT 'c-' || i, i, 'recorded', now() FROM generate_series(1, 20000) AS i",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let ids: Vec<serde_json::Value> = (0..500)
        .map(|i| serde_json::json!({"id": format!("c-{}", i * 37)}))
        .collect();
    let plan: Vec<String> = sqlx::query(&format!("EXPLAIN {lookup}"))
        .bind(serde_json::Value::Array(ids).to_string())
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<String, _>(0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("podstream_applied_pkey"), "{plan}");
    assert!(!plan.contains("Seq Scan on podstream_applied"), "{plan}");
}

/// Pruning forgets exactly the ids applied longer ago than the retention, however many there
/// are (several chunks), and the per-TI rows untouched as long, except a pod recorded alive.
async fn pruning(postgres: bool, name: &str) {
    let (_target, db) = prepared(Airflow::line("2.10"), postgres, name).await;
    let items = items(commands());
    db.apply_batch(&items).await.unwrap();
    let all = "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied";
    let recent = count(&db, all).await;
    assert!(recent > 0, "{name}: the batch recorded its ids");

    // 25,000 ids applied ten days ago: more than two chunks of the prune.
    let old = 25_000;
    let insert_old = if postgres {
        format!(
            "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at)
             SELECT 'old-' || i, i, 'recorded', now() - interval '10 days' FROM generate_series(1, {old}) AS i"
        )
    } else {
        format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {old})
             INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at)
             SELECT 'old-' || i, i, 'recorded', strftime('%Y-%m-%d %H:%M:%f', 'now', '-10 days') FROM n"
        )
    };
    sqlx::query(&insert_old).execute(&db.pool).await.unwrap();
    // And one just inside a week: kept.
    let inside = if postgres {
        "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at)
         VALUES ('six-days', 0, 'recorded', now() - interval '6 days')"
    } else {
        "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at)
         VALUES ('six-days', 0, 'recorded', strftime('%Y-%m-%d %H:%M:%f', 'now', '-6 days'))"
    };
    sqlx::query(inside).execute(&db.pool).await.unwrap();

    // The per-TI tables: ten days untouched go, except a pod recorded alive.
    let (ten_days, six_days) = if postgres {
        ("now() - interval '10 days'", "now() - interval '6 days'")
    } else {
        (
            "strftime('%Y-%m-%d %H:%M:%f', 'now', '-10 days')",
            "strftime('%Y-%m-%d %H:%M:%f', 'now', '-6 days')",
        )
    };
    for (task, last_command, at) in [
        ("old-done", "completed", ten_days),
        ("old-alive", "running", ten_days),
        ("recent-done", "fail", six_days),
    ] {
        sqlx::query(&format!(
            "INSERT INTO podstream_ti_pod (dag_id, task_id, run_id, map_index, try_number, pod_namespace, pod_name, pod_uid, owner, last_command, resource_version, updated_at)
             VALUES ('prune', '{task}', 'r', -1, 1, 'airflow', '{task}-pod', '{task}-uid', '1', '{last_command}', '1', {at})"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
        sqlx::query(&format!(
            "INSERT INTO podstream_ti_owner (dag_id, task_id, run_id, map_index, owner, stream_sequence, updated_at)
             VALUES ('prune', '{task}', 'r', -1, '2', 1, {at})"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
        sqlx::query(&format!(
            "INSERT INTO podstream_duplicate (dag_id, task_id, run_id, map_index, try_number, chosen_uid, other_uid, other_name, recorded_at)
             VALUES ('prune', '{task}', 'r', -1, 1, 'a', 'b', 'b-pod', {at})"
        ))
        .execute(&db.pool)
        .await
        .unwrap();
    }

    let week = Duration::from_secs(7 * 24 * 3600);
    let pruned = db.prune(week).await.unwrap();
    assert_eq!(pruned.of(History::Applied), old as u64, "{name}");
    assert_eq!(pruned.of(History::TiPod), 1, "{name}: the finished one");
    assert_eq!(pruned.of(History::TiOwner), 2, "{name}");
    assert_eq!(pruned.of(History::Duplicate), 2, "{name}");
    let left = |table: &str| {
        format!("SELECT CAST(COUNT(*) AS BIGINT) FROM {table} WHERE dag_id = 'prune'")
    };
    assert_eq!(count(&db, &left("podstream_ti_pod")).await, 2, "{name}");
    assert_eq!(count(&db, &left("podstream_ti_owner")).await, 1, "{name}");
    assert_eq!(count(&db, &left("podstream_duplicate")).await, 1, "{name}");
    assert_eq!(
        count(&db, all).await,
        recent + 1,
        "{name}: the recent ids stay"
    );
    let old_left =
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied WHERE command_id LIKE 'old-%'";
    assert_eq!(count(&db, old_left).await, 0, "{name}");
    assert_eq!(
        db.prune(week)
            .await
            .unwrap()
            .0
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>(),
        0,
        "{name}: nothing more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_forgets_only_ids_older_than_the_retention_on_sqlite() {
    pruning(false, "prune_sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruning_forgets_only_ids_older_than_the_retention_on_postgres() {
    pruning(true, "prune_pg").await;
}

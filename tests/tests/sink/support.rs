//! What the sink's tests share: the seeded task instances, the commands and what they
//! must do, a prepared database, the streams and a `podstream sink` to run.

pub(crate) use async_nats::jetstream;
pub(crate) use podstream_bus::BusConfig;
pub(crate) use podstream_proto::subject::stream_names;
pub(crate) use podstream_proto::subject::{Stream, Subjects};
pub(crate) use podstream_proto::v1::command::Kind;
pub(crate) use podstream_proto::v1::{
    Completed, ContainerTerminated, Duplicate, Fail, Running, Transfer,
};
pub(crate) use podstream_proto::{Command, PodRef, TaskKey};
pub(crate) use podstream_sink::guard::{Effect, FailState, Policy, Skip, TaskFailures};
pub(crate) use podstream_sink::lanes::LaneConfig;
pub(crate) use podstream_sink::retention::History;
pub(crate) use podstream_sink::service::{self, SinkConfig};
pub(crate) use podstream_sink::{Database, Item, Outcome};
pub(crate) use podstream_tests::airflow::{Airflow, AirflowDb, SeedTi};
pub(crate) use podstream_tests::bus;
pub(crate) use podstream_tests::nats::NatsServer;
pub(crate) use podstream_tests::postgres::PgCluster;
pub(crate) use prost::Message as _;
pub(crate) use sqlx::Row;
pub(crate) use std::sync::OnceLock;
pub(crate) use std::time::Duration;

pub(crate) const DAG: &str = "etl";
pub(crate) const RUN: &str = "manual__2026-11-30";

pub(crate) const UP_FOR_RETRY: Effect = Effect::Fail {
    state: FailState::UpForRetry,
};
pub(crate) const FAILED: Effect = Effect::Fail {
    state: FailState::Failed,
};

pub(crate) fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(PgCluster::start)
}

pub(crate) fn seed() -> Vec<SeedTi<'static>> {
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

pub(crate) fn key(task_id: &str, map_index: i64, try_number: i64) -> TaskKey {
    TaskKey {
        dag_id: DAG.into(),
        task_id: task_id.into(),
        run_id: RUN.into(),
        map_index,
        try_number,
        ..TaskKey::default()
    }
}

pub(crate) fn pod(name: &str) -> PodRef {
    PodRef {
        namespace: "airflow".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

pub(crate) fn command(id: &str, task: TaskKey, kind: Kind) -> Command {
    Command {
        id: id.into(),
        pod: Some(pod(&format!("{}-{}", task.task_id, task.map_index.max(0)))),
        task: Some(task),
        owner: "1".into(),
        resource_version: "42".into(),
        kind: Some(kind),
    }
}

pub(crate) fn fail() -> Kind {
    Kind::Fail(Fail::new(
        "pod_failed".into(),
        "base exited 1".into(),
        vec![],
    ))
}

pub(crate) fn commands() -> Vec<Command> {
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

pub(crate) fn expected_outcomes() -> Vec<Outcome> {
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

pub(crate) fn expected_states() -> Vec<(String, i64, String)> {
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
pub(crate) fn items(commands: Vec<Command>) -> Vec<Item> {
    commands
        .into_iter()
        .map(|command| Item {
            command,
            sequence: None,
        })
        .collect()
}

pub(crate) async fn prepared(
    airflow: Airflow,
    postgres: bool,
    name: &str,
) -> (AirflowDb, Database) {
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

pub(crate) async fn states(db: &Database) -> Vec<(String, i64, String)> {
    sqlx::query("SELECT task_id, CAST(map_index AS BIGINT), state FROM task_instance ORDER BY task_id, map_index")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get::<String, _>(0), row.get::<i64, _>(1), row.get::<Option<String>, _>(2).unwrap_or_default()))
        .collect()
}

pub(crate) async fn count(db: &Database, sql: &str) -> i64 {
    sqlx::query(sql)
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

/// A fail with `reason` and, when given, the container that ended with `terminated`.
pub(crate) fn fail_with(reason: &str, terminated: Option<&str>) -> Kind {
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

/// Applies `items` through `lanes` lanes, in small batches so a lane commits several.
pub(crate) async fn through_lanes(db: &Database, items: &[Item], lanes: usize) -> Vec<Outcome> {
    let config = LaneConfig {
        lanes,
        batch_size: 4,
        batch_wait: Duration::ZERO,
        health: podstream_bus::Health::new(),
    };
    podstream_tests::sink::through_lanes(db, items, config).await
}

pub(crate) async fn publish(js: &jetstream::Context, commands: &[Command]) {
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

pub(crate) async fn ensure_streams(js: &jetstream::Context) {
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

pub(crate) fn start_sink(
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

pub(crate) fn start_sink_with(
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

pub(crate) async fn wait_for(db: &Database, sql: &str, want: i64) {
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

/// The sink's consumer, once a starting sink has made it.
pub(crate) async fn sink_consumer(js: &jetstream::Context) -> jetstream::consumer::PullConsumer {
    let stream = js.get_stream(stream_names::COMMANDS).await.unwrap();
    loop {
        if let Ok(consumer) = stream.get_consumer(service::DEFAULT_CONSUMER).await {
            return consumer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While the database refuses: nothing is dead-lettered, and the sink holds every command
/// unacked.
pub(crate) async fn every_command_held(
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

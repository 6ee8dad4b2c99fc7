//! A database that refuses, a read-only SQLite file, SIGTERM while the database is down, a
//! PostgreSQL restart mid-stream: outages, not bad commands; nothing is lost or doubled.

use super::support::*;

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

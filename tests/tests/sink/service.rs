//! `podstream sink` on a real nats-server: beside executors that fail tasks, across a crash
//! between commit and ack, three sinks sharing the consumer, a database slower than the ack
//! wait.

use super::support::*;

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

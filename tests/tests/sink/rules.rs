//! Every apply rule on real Airflow databases (2.10 and 3.1, SQLite and PostgreSQL, made by
//! Airflow's migrations), exactly once, read back through Airflow itself; the lanes, an
//! unknown revision, a refused command, and the statements' use of the keys.

use super::support::*;

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

/// A pod that fails while its TI is still `queued` failed before the task process started:
/// the sink records `launch_failed` and leaves the TI to the executor's relaunch, unless the
/// container's reason is excluded (`Error` by default, as in Airflow) and the pod is the one
/// bound to the try (the first that ran): a copy cannot fail a queued TI. A running TI fails
/// as ever. On Airflow 3, a pod naming a TI UUID moves only the TI with that id; on Airflow 2, a
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
        ti("queued_error_bound", "queued", 0),
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
            Outcome::Applied(Effect::LaunchFailed),
            "queued",
        ),
        (
            command("l2r", at("queued_error_bound"), Kind::Running(Running {})),
            Outcome::Applied(Effect::Record),
            // As the rows read after the batch: the fail below moved it.
            "failed",
        ),
        (
            command(
                "l2b",
                at("queued_error_bound"),
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
    let ran = command("l8r", at("queued_pull_excluded"), Kind::Running(Running {}));
    let pull = command(
        "l8",
        at("queued_pull_excluded"),
        fail_with("fatal_pending:ErrImagePull", None),
    );
    assert_eq!(
        strict.apply_batch(&items(vec![ran, pull])).await.unwrap(),
        vec![Outcome::Applied(Effect::Record), Outcome::Applied(FAILED)],
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
        launch_logs, 3,
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
    assert_eq!(recorded, 3, "{name}: recorded in podstream_applied");
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

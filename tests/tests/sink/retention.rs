//! Pruning applied command ids: only those older than the retention go.

use super::support::*;

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

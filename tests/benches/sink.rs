//! Commands per second into the metadata DB, batched against one transaction per command,
//! side by side in one run, on PostgreSQL and SQLite (Airflow 2.10 schemas made by Airflow).
//!
//! `cargo bench -p podstream-tests --bench sink`. Without `--bench` it does a smoke run.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use podstream_proto::v1::Fail;
use podstream_proto::v1::command::Kind;
use podstream_proto::{Command, PodRef, TaskKey};
use podstream_sink::lanes::LaneConfig;
use podstream_sink::{Database, Item, Outcome};
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::postgres::PgCluster;

/// The allocator the `podstream` binary (and so `podstream sink`) uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn fail(i: usize) -> Item {
    let command = Command {
        id: format!("bench-{i}"),
        task: Some(TaskKey {
            dag_id: "bench".into(),
            task_id: format!("t{i:06}"),
            run_id: "r".into(),
            map_index: -1,
            try_number: 1,
            ..TaskKey::default()
        }),
        pod: Some(PodRef {
            namespace: "airflow".into(),
            name: format!("p{i}"),
            uid: format!("u{i}"),
        }),
        owner: "1".into(),
        resource_version: "5".into(),
        kind: Some(Kind::Fail(Fail::new(
            "pod_failed".into(),
            "base exited 1".into(),
            vec![],
        ))),
    };
    Item {
        command,
        sequence: Some(i as u64),
    }
}

async fn seed(target: &AirflowDb, db: &Database, n: usize) {
    let mut tx = db.pool.begin().await.unwrap();
    let ts = if target.is_postgres() {
        "'2026-11-30 10:00:00+00'"
    } else {
        "'2026-11-30 10:00:00.000000'"
    };
    sqlx::query(&format!("INSERT INTO dag_run (dag_id, execution_date, run_id, run_type, state, clear_number) VALUES ('bench', {ts}, 'r', 'manual', 'running', 0)"))
        .execute(&mut *tx)
        .await
        .unwrap();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let values: Vec<String> = chunk
            .iter()
            .map(|i| {
                format!("('t{i:06}', 'bench', 'r', -1, 'running', 1, 1, 'default_pool', 1, {ts})")
            })
            .collect();
        sqlx::query(&format!(
            "INSERT INTO task_instance (task_id, dag_id, run_id, map_index, state, try_number, max_tries, pool, pool_slots, start_date) VALUES {}",
            values.join(", ")
        ))
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    if target.is_postgres() {
        // As autovacuum would have by now on a live database: plans need statistics.
        sqlx::query("ANALYZE").execute(&db.pool).await.unwrap();
    }
}

async fn measure(name: &str, target: AirflowDb, batched: usize, single: usize) {
    let db = Database::connect(&target.url).await.unwrap();
    seed(&target, &db, 2 * batched + single).await;
    let items: Vec<Item> = (0..2 * batched + single).map(fail).collect();
    let (batch_items, rest) = items.split_at(batched);
    let (parallel_items, single_items) = rest.split_at(batched);

    let started = Instant::now();
    for chunk in single_items.chunks(1) {
        let outcomes = db.apply_batch(chunk).await.unwrap();
        assert!(matches!(outcomes[0], Outcome::Applied(_)));
    }
    let single_rate = single as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    for chunk in batch_items.chunks(500) {
        let outcomes = db.apply_batch(chunk).await.unwrap();
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::Applied(_))));
    }
    let batch_rate = batched as f64 / started.elapsed().as_secs_f64();

    // As `podstream sink` applies: `CONNECTIONS` lanes, a TI always in the same one, each
    // committing batches of up to 500 without waiting for the others.
    let started = Instant::now();
    let config = LaneConfig {
        lanes: CONNECTIONS,
        batch_size: 500,
        batch_wait: Duration::ZERO,
        health: podstream_bus::Health::new(),
    };
    let outcomes = podstream_tests::sink::through_lanes(&db, parallel_items, config).await;
    assert!(outcomes.iter().all(|o| matches!(o, Outcome::Applied(_))));
    let parallel_rate = batched as f64 / started.elapsed().as_secs_f64();
    println!(
        "{name:<10} one transaction per command {single_rate:>8.0} commands/s ({single} commands) | batches of 500 {batch_rate:>8.0} commands/s ({batched} commands), ratio {:.1}x | over {CONNECTIONS} lanes {parallel_rate:>8.0} commands/s, ratio {:.1}x",
        batch_rate / single_rate,
        parallel_rate / single_rate
    );
}

/// The sink's default `--connections`.
const CONNECTIONS: usize = podstream_sink::service::DEFAULT_CONNECTIONS;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (batched, single) = if full { (20_000, 2_000) } else { (500, 50) };
    let runtime = podstream_tests::bench_runtime();
    runtime.block_on(async {
        let pg = PgCluster::start();
        measure(
            "PostgreSQL",
            AirflowDb::postgres(Airflow::line("2.10"), &pg, "bench"),
            batched,
            single,
        )
        .await;
        measure(
            "SQLite",
            AirflowDb::sqlite(Airflow::line("2.10")),
            batched,
            single,
        )
        .await;
    });
}

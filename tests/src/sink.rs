//! The sink's lanes driven as `podstream sink` drives them, for tests and benches.

use podstream_sink::lanes::{LaneConfig, Lanes};
use podstream_sink::{Database, Item, Outcome};

/// Applies `items` through lanes set up by `config` and returns each command's outcome in
/// the order sent.
///
/// # Panics
/// When a lane stops, a command comes back twice, or one does not come back.
pub async fn through_lanes(db: &Database, items: &[Item], config: LaneConfig) -> Vec<Outcome> {
    let (lanes, mut applied) = Lanes::<usize>::start(db, config);
    // Drained while commands go in, as the service does.
    let collecting = tokio::spawn({
        let count = items.len();
        async move {
            let mut outcomes: Vec<Option<Outcome>> = vec![None; count];
            while let Some(batch) = applied.recv().await {
                for (_, index, outcome) in batch {
                    assert!(
                        outcomes[index].replace(outcome).is_none(),
                        "command {index} applied twice"
                    );
                }
            }
            outcomes
        }
    });
    for (index, item) in items.iter().enumerate() {
        lanes
            .send(item.clone(), index)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    lanes.close().await;
    let outcomes = collecting.await.unwrap_or_else(|e| panic!("{e}"));
    outcomes
        .into_iter()
        .enumerate()
        .map(|(index, o)| o.unwrap_or_else(|| panic!("command {index} did not come back")))
        .collect()
}

/// Inserts `running` TIs `<prefix>NNNNNN` (numbers `from..to`, zero-padded to `digits`) of
/// `dag_id`/`run_id`, queued by scheduler 1, and analyzes the table as autovacuum soon would
/// (without statistics the planner scans the whole table per TI). The run must exist.
///
/// # Panics
/// When the database refuses.
pub async fn seed_running_tis(
    db: &Database,
    dag_id: &str,
    run_id: &str,
    prefix: &str,
    numbers: std::ops::Range<usize>,
    digits: usize,
) {
    if !numbers.is_empty() {
        let (from, to) = (numbers.start, numbers.end - 1);
        sqlx::query(&format!(
            "INSERT INTO task_instance (task_id, dag_id, run_id, map_index, state, try_number, max_tries, pool, pool_slots, start_date, queued_by_job_id)
             SELECT '{prefix}' || lpad(g::text, {digits}, '0'), '{dag_id}', '{run_id}', -1, 'running', 1, 1, 'default_pool', 1, now(), 1
             FROM generate_series({from}, {to}) AS g"
        ))
        .execute(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("seeding TIs: {e}"));
    }
    sqlx::query("ANALYZE task_instance")
        .execute(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("analyzing task_instance: {e}"));
}

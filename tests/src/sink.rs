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

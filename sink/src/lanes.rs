//! Applying commands in lanes, one per database connection. A task instance always goes to
//! the same lane, so its commands keep their order; lanes never wait for one another (a
//! batch split over connections and joined again would leave every connection idle until
//! the slowest part had committed).
//!
//! A lane's batch is whatever is queued for it (up to the batch size), applied in one
//! transaction with [`Database::apply_batch`] and retried with backoff while the database
//! is unreachable. What each command was attached to on the way in (a JetStream message,
//! an index) comes back with its outcome, so the caller acks only what is committed.

use std::time::Duration;

use podstream_bus::{Backoff, Condition, Health};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::db::{Database, POOL_SIZE};
use crate::dialect::Backend;
use crate::item::{Item, Outcome};

/// Batches a lane may hold queued, besides the one it is applying.
const QUEUED_BATCHES: usize = 4;

/// Commands a lane applied in one transaction, each with its tag and outcome, in order.
pub type Applied<T> = Vec<(Item, T, Outcome)>;

/// How the lanes batch.
#[derive(Debug, Clone)]
pub struct LaneConfig {
    /// Lanes on PostgreSQL (at most the pool's size); SQLite has one writer, so one lane.
    pub lanes: usize,
    /// Commands per transaction at most.
    pub batch_size: usize,
    /// How long a batch smaller than `batch_size` waits for more (zero: not at all).
    pub batch_wait: Duration,
    /// Readiness: the database answering is flipped by each batch.
    pub health: Health,
}

/// The running lanes; the receiving end of their applied batches is handed out by
/// [`Lanes::start`].
pub struct Lanes<T> {
    queues: Vec<mpsc::Sender<(Item, T)>>,
    tasks: Vec<JoinHandle<()>>,
}

/// A lane stopped (it can only panic); the command was not applied.
#[derive(Debug, thiserror::Error)]
#[error("sink lane {0} stopped")]
pub struct LaneStopped(pub usize);

impl<T: Send + 'static> Lanes<T> {
    /// Starts the lanes. Applied batches arrive on the receiver; it ends once the lanes are
    /// closed and have applied everything queued.
    pub fn start(
        db: &Database,
        config: LaneConfig,
    ) -> (Lanes<T>, mpsc::UnboundedReceiver<Applied<T>>) {
        let count = match db.backend {
            Backend::Postgres => config.lanes.clamp(1, POOL_SIZE as usize),
            Backend::Sqlite => 1,
        };
        let batch_size = config.batch_size.max(1);
        let (applied, receiver) = mpsc::unbounded_channel();
        let mut queues = Vec::with_capacity(count);
        let mut tasks = Vec::with_capacity(count);
        for _ in 0..count {
            // Room for a few batches while one commits: commands arrive interleaved across
            // lanes, and a full lane stalls the others' supply until it takes its next batch.
            let (queue, lane_queue) = mpsc::channel(QUEUED_BATCHES * batch_size);
            queues.push(queue);
            tasks.push(tokio::spawn(lane(
                db.clone(),
                lane_queue,
                batch_size,
                config.batch_wait,
                config.health.clone(),
                applied.clone(),
            )));
        }
        (Lanes { queues, tasks }, receiver)
    }

    /// Queues `item` on its TI's lane, waiting while that lane is full.
    pub async fn send(&self, item: Item, tag: T) -> Result<(), LaneStopped> {
        let lane = partition_of(&item, self.queues.len());
        match self.queues.get(lane) {
            Some(queue) => queue.send((item, tag)).await.map_err(|_| LaneStopped(lane)),
            None => Err(LaneStopped(lane)),
        }
    }

    /// Closes the queues and waits until every lane has applied what it held.
    pub async fn close(self) {
        drop(self.queues);
        for task in self.tasks {
            if let Err(panic) = task.await {
                tracing::error!(%panic, "a sink lane panicked");
            }
        }
    }
}

/// The lane of `item` among `lanes`: by its TI key (not the try, so a TI's tries stay in
/// order too); commands without one all go to the first.
fn partition_of(item: &Item, lanes: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let Some(key) = crate::batch::key_of(&item.command) else {
        return 0;
    };
    // A fixed hasher: the routing needs no secret, only spreading.
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % lanes.max(1) as u64) as usize
}

async fn lane<T>(
    db: Database,
    mut queue: mpsc::Receiver<(Item, T)>,
    batch_size: usize,
    batch_wait: Duration,
    health: Health,
    applied: mpsc::UnboundedSender<Applied<T>>,
) {
    let mut batch = Vec::with_capacity(batch_size);
    while next_batch(&mut queue, &mut batch, batch_size, batch_wait).await {
        let (items, tags): (Vec<Item>, Vec<T>) = batch.drain(..).unzip();
        let outcomes = apply_with_retry(&db, &items, &health).await;
        let done = items
            .into_iter()
            .zip(tags)
            .zip(outcomes)
            .map(|((item, tag), outcome)| (item, tag, outcome))
            .collect();
        if applied.send(done).is_err() {
            // Nobody acks any more: what is still queued will be redelivered.
            return;
        }
    }
}

/// Fills `batch` with what is queued, up to `batch_size`; a smaller batch keeps taking what
/// arrives until `batch_wait` after its first item. False once the queue is closed and empty.
async fn next_batch<X>(
    queue: &mut mpsc::Receiver<X>,
    batch: &mut Vec<X>,
    batch_size: usize,
    batch_wait: Duration,
) -> bool {
    if queue.recv_many(batch, batch_size).await == 0 {
        return false;
    }
    let deadline = tokio::time::Instant::now() + batch_wait;
    while batch.len() < batch_size && !batch_wait.is_zero() {
        let room = batch_size - batch.len();
        match tokio::time::timeout_at(deadline, queue.recv_many(batch, room)).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    true
}

/// Applies a batch, retrying with backoff while the database as a whole fails it
/// (`apply_batch` returns only such faults): nothing is acked or dead-lettered meanwhile,
/// and the progress acks keep the batch's messages from redelivery.
async fn apply_with_retry(db: &Database, items: &[Item], health: &Health) -> Vec<Outcome> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
    loop {
        let started = std::time::Instant::now();
        let result = db.apply_batch(items).await;
        metrics::histogram!(podstream_bus::metrics::SINK_BATCH_SECONDS)
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(outcomes) => {
                health.set(Condition::DatabaseAnswers, true);
                return outcomes;
            }
            Err(error) => {
                health.set(Condition::DatabaseAnswers, false);
                metrics::counter!(podstream_bus::metrics::SINK_BATCH_RETRIES).increment(1);
                tracing::warn!(%error, commands = items.len(), retry_in_ms = backoff.delay().as_millis() as u64, "the database failed a batch; retrying it");
                backoff.wait().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use podstream_proto::{Command, TaskKey};

    use super::*;

    fn item(id: &str, task_id: &str, try_number: i64) -> Item {
        Item {
            command: Command {
                id: id.into(),
                task: Some(TaskKey {
                    dag_id: "d".into(),
                    task_id: task_id.into(),
                    run_id: "r".into(),
                    map_index: -1,
                    try_number,
                    ..TaskKey::default()
                }),
                ..Command::default()
            },
            sequence: None,
        }
    }

    /// Every command of a TI, whatever its id or try, takes the TI's lane; TIs spread.
    #[test]
    fn a_task_instance_always_takes_the_same_lane() {
        let mut used = std::collections::HashSet::new();
        for task in 0..200 {
            let task_id = format!("t{task}");
            let lane = partition_of(&item("a", &task_id, 1), 3);
            for (id, try_number) in [("b", 1), ("c", 2), ("another-id", 3)] {
                assert_eq!(
                    partition_of(&item(id, &task_id, try_number), 3),
                    lane,
                    "{task_id}"
                );
            }
            used.insert(lane);
        }
        assert_eq!(used.len(), 3, "200 TIs over 3 lanes use all three");
        let keyless = Item {
            command: Command::default(),
            sequence: None,
        };
        assert_eq!(partition_of(&keyless, 3), 0);
    }

    /// Items arriving every 2 ms after the batch's first, and what a batch takes.
    #[tokio::test(start_paused = true)]
    async fn a_smaller_batch_takes_what_arrives_until_its_wait_is_over() {
        for (batch_size, wait_ms, expected) in [
            (100, 0, 1),   // no wait: only what is queued
            (100, 5, 3),   // the first and those of the next 5 ms
            (100, 50, 21), // all of them
            (4, 50, 4),    // a full batch does not wait
        ] {
            let (queue, mut batch_queue) = mpsc::channel(100);
            queue.send(0).await.unwrap();
            let sender = tokio::spawn(async move {
                for i in 1..=20 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    queue.send(i).await.unwrap();
                }
            });
            let wait = Duration::from_millis(wait_ms);
            let mut batch = Vec::new();
            assert!(next_batch(&mut batch_queue, &mut batch, batch_size, wait).await);
            assert_eq!(
                batch,
                (0..expected).collect::<Vec<_>>(),
                "{batch_size} {wait_ms} ms"
            );
            sender.abort();
        }
    }

    #[tokio::test]
    async fn a_closed_empty_queue_ends_the_lane() {
        let (queue, mut batch_queue) = mpsc::channel::<u32>(4);
        queue.send(7).await.unwrap();
        drop(queue);
        let mut batch = Vec::new();
        let wait = Duration::from_millis(50);
        assert!(next_batch(&mut batch_queue, &mut batch, 4, wait).await);
        assert_eq!(batch, [7]);
        batch.clear();
        assert!(!next_batch(&mut batch_queue, &mut batch, 4, wait).await);
    }
}

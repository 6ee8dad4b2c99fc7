//! The processor's side of the consumer loop ([`podstream_bus::consume`]) for pod events:
//! each event decoded to its task instance, queued in its TI's lane, and the lanes that are
//! free decided, at most `--concurrency` at once.

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt};
use podstream_bus::consume::{ConsumerLoop, Decoded, Handler, HandlerStopped, Pulling, Sharing};
use podstream_proto::PodEvent;
use podstream_rules::decide::identity;
use podstream_rules::record::TaskRecord;
use prost::Message as _;
use tracing::warn;

use super::ProcessConfig;
use super::worker::{PodDelivery, PodItem, Worker};
use crate::stats::ProcessStats;
use crate::task_lanes::{self, TaskLanes};

impl Worker {
    /// Runs the consumer loop on `consumer` until `stopped`, then lets its pin go.
    pub(super) async fn run_consumer(
        &self,
        consumer: async_nats::jetstream::consumer::PullConsumer,
        config: &ProcessConfig,
        stopped: tokio::sync::watch::Receiver<bool>,
    ) -> ProcessStats {
        let consumer = ConsumerLoop {
            consumer,
            sharing: Sharing::Pinned {
                stream: Box::new(self.pods.clone()),
                failover: config.failover,
            },
            pulling: self.pulling(config.batch_size),
            dead: self.dead_letters(),
        };
        let mut handler = PodHandler {
            worker: self,
            limit: config.concurrency.max(1),
            lanes: TaskLanes::default(),
            running: FuturesUnordered::new(),
            stats: ProcessStats::default(),
        };
        match consumer.run(&mut handler, stopped).await {
            Ok(consumed) => handler.stats.dead_lettered += consumed.dead_lettered,
            Err(error) => warn!(%error, "the pod consumer stopped"),
        }
        handler.stats
    }

    /// How this instance pulls each of its consumers.
    pub(super) fn pulling(&self, batch_size: usize) -> Pulling {
        Pulling {
            batch_size,
            in_flight: self.in_flight.clone(),
            health: self.health.clone(),
        }
    }
}

/// Decides pod events by task instance: one group per TI at a time, `limit` TIs at once.
struct PodHandler<'w> {
    worker: &'w Worker,
    limit: usize,
    lanes: TaskLanes<PodDelivery>,
    running: FuturesUnordered<BoxFuture<'w, (String, ProcessStats)>>,
    stats: ProcessStats,
}

impl Handler for PodHandler<'_> {
    type Item = PodItem;
    type Done = (String, ProcessStats);

    fn decode(&self, message: &async_nats::jetstream::Message) -> Decoded<PodItem> {
        match PodEvent::decode(message.payload.as_ref()) {
            // The ingest refuses keys out of bounds; a message from elsewhere must not make a
            // KV key the server refuses (retried without end, it would stall the stage).
            Ok(event) => match identity(&event).and_then(|(_, task)| {
                task.check_bounds()?;
                Ok(TaskRecord::key(task))
            }) {
                Ok(key) => Decoded::Item(PodItem { event, key }),
                Err(error) => Decoded::Dead(error.to_string()),
            },
            Err(error) => Decoded::Dead(format!("not a PodEvent: {error}")),
        }
    }

    fn has_room(&self) -> bool {
        self.running.len() < self.limit
    }

    async fn take(&mut self, deliveries: Vec<PodDelivery>) -> Result<(), HandlerStopped> {
        let by_key = deliveries.into_iter().map(|d| (d.item.key.clone(), d));
        for (key, events) in task_lanes::by_key(by_key) {
            if let Some(group) = self.lanes.arrived(&key, events) {
                self.running.push(self.worker.group(key, group).boxed());
            }
        }
        Ok(())
    }

    async fn finished(&mut self) -> Option<(String, ProcessStats)> {
        self.running.next().await
    }

    async fn after(&mut self, (key, one): (String, ProcessStats)) {
        self.stats += one;
        if let Some(next) = self.lanes.finished(&key) {
            self.running.push(self.worker.group(key, next).boxed());
        }
    }
}

//! The loop of one pod consumer: pull batches, sort out notices and malformed messages,
//! queue each task instance's events in its lane and decide the lanes that are free, at most
//! `--concurrency` at once; on shutdown, finish what is in hand and hand the rest back.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt};
use podstream_bus::dead::{self, DeadLetter};
use podstream_bus::in_flight::Held;
use podstream_bus::{Backoff, Condition};
use podstream_proto::PodEvent;
use podstream_proto::subject::Stage;
use prost::Message as _;
use tracing::warn;

use super::ProcessConfig;
use super::worker::{Delivery, Worker};
use crate::decide::identity;
use crate::pinned::{self, PRIORITY_GROUP};
use crate::record::TaskRecord;
use crate::stats::ProcessStats;
use crate::task_lanes::{self, TaskLanes};

impl Worker {
    /// Pulls `consumer` until `stopped`, pulling again after a failure, then lets its pin go.
    pub(super) async fn run_consumer(
        &self,
        consumer: jetstream::consumer::PullConsumer,
        config: &ProcessConfig,
        stopped: tokio::sync::watch::Receiver<bool>,
    ) -> ProcessStats {
        let mut stats = ProcessStats::default();
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        while !*stopped.borrow() {
            match self
                .consume(&consumer, config, stopped.clone(), &mut stats)
                .await
            {
                Ok(()) => break,
                Err(error) => {
                    self.health.set(Condition::ConsumerBound, false);
                    warn!(%error, consumer = %consumer.cached_info().name, "pulling pod events failed; retrying");
                    backoff.wait().await;
                }
            }
        }
        pinned::release(&self.pods, &consumer).await;
        stats
    }

    /// Pulls one consumer until `stopped`; returns an error when the pull stream fails.
    async fn consume(
        &self,
        consumer: &jetstream::consumer::PullConsumer,
        config: &ProcessConfig,
        mut stopped: tokio::sync::watch::Receiver<bool>,
        stats: &mut ProcessStats,
    ) -> anyhow::Result<()> {
        let messages = consumer
            .stream()
            .group(PRIORITY_GROUP)
            .max_messages_per_batch(config.batch_size)
            // Well below the priority timeout, so a live instance keeps its pin.
            .expires((config.failover / 4).max(Duration::from_millis(200)))
            .messages()
            .await
            .context("starting the pull")?;
        self.health.set(Condition::ConsumerBound, true);
        let messages = self.in_flight.receive(messages);
        let mut chunks = messages.ready_chunks(config.batch_size.max(1));
        let limit = config.concurrency.max(1);
        let mut lanes: TaskLanes<Delivery> = TaskLanes::default();
        let mut running: FuturesUnordered<BoxFuture<'_, (String, ProcessStats)>> =
            FuturesUnordered::new();
        // Once stopping (or the pull stream has ended), nothing more is pulled, but what is in
        // hand is decided before the consumer is let go: the running groups and the events
        // waiting behind them. The loop ends when nothing is left running.
        let mut stopping = false;
        let mut pulled = Ok(());
        loop {
            let next = tokio::select! {
                _ = stopped.wait_for(|s| *s), if !stopping => Next::Stop,
                Some((key, one)) = running.next(), if !running.is_empty() => Next::Finished(key, one),
                chunk = chunks.next(), if !stopping && running.len() < limit => Next::Pulled(chunk),
                else => break,
            };
            let chunk = match next {
                Next::Stop => {
                    stopping = true;
                    continue;
                }
                Next::Finished(key, one) => {
                    *stats += one;
                    if let Some(next) = lanes.finished(&key) {
                        running.push(self.group(key, next).boxed());
                    }
                    continue;
                }
                Next::Pulled(Some(chunk)) => chunk,
                Next::Pulled(None) => {
                    pulled = Err(anyhow::anyhow!("the pull stream ended"));
                    stopping = true;
                    continue;
                }
            };
            let mut decide = Vec::with_capacity(chunk.len());
            for message in chunk {
                match message {
                    Ok(message) => match self.accept(message).await {
                        Accepted::Decide(delivery) => {
                            decide.push((delivery.key.clone(), *delivery))
                        }
                        Accepted::Done => {}
                        Accepted::Dead => stats.dead_lettered += 1,
                    },
                    Err(error) => warn!(%error, "receiving a pod event failed"),
                }
            }
            for (key, events) in task_lanes::by_key(decide) {
                if let Some(group) = lanes.arrived(&key, events) {
                    running.push(self.group(key, group).boxed());
                }
            }
        }
        // What arrived but was not decided goes back at once, for the next pinned instance.
        while let Some(Some(chunk)) = chunks.next().now_or_never() {
            for message in chunk.into_iter().flatten() {
                let _ = message.ack_with(AckKind::Nak(None)).await;
            }
        }
        pulled
    }

    /// Sorts out notices and malformed messages; the rest is decided.
    async fn accept(&self, message: Held) -> Accepted {
        let sequence = message.info().map(|i| i.stream_sequence).unwrap_or(0);
        if podstream_bus::role::is_left_notice(message.headers.as_ref()) {
            // The owner's side of a transfer: the event itself is on the new owner's subject.
            ack(&message).await;
            return Accepted::Done;
        }
        let reason = match PodEvent::decode(message.payload.as_ref()) {
            // The ingest refuses keys out of bounds; a message from elsewhere must not make a
            // KV key the server refuses (retried without end, it would stall the stage).
            Ok(event) => match identity(&event).and_then(|(pod, task)| {
                task.check_bounds()?;
                Ok((pod, task))
            }) {
                Ok((_, task)) => {
                    let key = TaskRecord::key(task);
                    return Accepted::Decide(Box::new(Delivery {
                        message,
                        sequence,
                        event,
                        key,
                    }));
                }
                Err(error) => error.to_string(),
            },
            Err(error) => format!("not a PodEvent: {error}"),
        };
        self.dead_letter(&message, sequence, reason).await;
        Accepted::Dead
    }

    /// Stores `message` (stream sequence `sequence`) as the processor's dead letter for
    /// `reason`, then acks it.
    pub(super) async fn dead_letter(&self, message: &Held, sequence: u64, reason: String) {
        warn!(subject = %message.subject, sequence, %reason, "pod event dead-lettered");
        let letter = DeadLetter::of_message(&self.subjects, Stage::Processor, message, reason);
        dead::store(&self.js, &letter).await;
        ack(message).await;
    }
}

/// What the consume loop woke up for.
enum Next<C> {
    /// Shutdown was asked for.
    Stop,
    /// A TI's group was decided: its key and what it did.
    Finished(String, ProcessStats),
    /// Pod events pulled (`None`: the pull stream ended).
    Pulled(Option<C>),
}

enum Accepted {
    Decide(Box<Delivery>),
    Done,
    Dead,
}

pub(super) async fn ack(message: &jetstream::Message) {
    if let Err(error) = message.ack_with(AckKind::Ack).await {
        // Redelivered then, and found already decided.
        warn!(%error, "ack failed; the event will be redelivered and skipped");
    }
}

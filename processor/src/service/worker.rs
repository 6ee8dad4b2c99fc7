//! Deciding one task instance's events: its record read (or taken from the cache), every
//! event decided in order with any earlier undecided event of its pods first, the record
//! written once by compare-and-set, then the commands published and the events acked.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use podstream_bus::consume::{DeadLetters, Delivery, ack, dead_letter};
use podstream_bus::dead;
use podstream_bus::in_flight::InFlight;
use podstream_bus::retry::{self, Classify, Retrying, Verdict};
use podstream_bus::{Condition, Health};
use podstream_proto::PodEvent;
use podstream_proto::signature::Unsigned;
use podstream_proto::subject::{Stage, Subjects};
use podstream_proto::v1::Command;
use podstream_rules::decide::identity;
use podstream_rules::record::TaskRecord;
use podstream_rules::{Ignored, Outcome, Rules};
use prost::Message as _;
use tracing::{debug, warn};

use crate::record_cache::{Cached, RecordCache};
use crate::stats::ProcessStats;

/// A pod event and the key of its task instance's record.
pub(super) struct PodItem {
    pub event: PodEvent,
    pub key: String,
}

/// A pod event taken off the consumer.
pub(super) type PodDelivery = Delivery<PodItem>;

/// What every consumer loop shares.
pub(super) struct Worker {
    pub js: jetstream::Context,
    /// Every event pulled and not yet acked, kept from redelivery while it is decided.
    pub in_flight: InFlight,
    pub pods: stream::Stream,
    pub records: kv::Store,
    pub cache: RecordCache,
    pub subjects: Subjects,
    pub rules: Rules,
    pub health: Health,
}

/// What deciding a group did, once its record was written.
#[derive(Default)]
struct Decided {
    /// Commands published.
    commands: u64,
    /// The group's events (by index) decided foreign for want of a valid signature, and why.
    unsigned: Vec<(usize, Unsigned)>,
}

/// Counts and logs a decided event whose pod is foreign for want of a valid signature.
fn report_unsigned(event: &PodEvent, reason: Unsigned) {
    metrics::counter!(podstream_bus::metrics::PROCESSOR_UNSIGNED_EVENTS, "reason" => reason.name())
        .increment(1);
    if let Ok((pod, task)) = identity(event) {
        podstream_rules::warn_unsigned(event, pod, task, reason);
    }
}

/// Why deciding a group of events failed, with the cause's own type.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("reading task record")]
    Load(#[source] kv::EntryError),
    #[error("encoding task record")]
    Encode(#[source] serde_json::Error),
    #[error("writing task record")]
    Store(#[source] kv::UpdateError),
    #[error("looking up earlier events of the pod")]
    Lookup(#[source] jetstream::stream::RawMessageError),
    #[error("publishing commands")]
    Publish(#[source] jetstream::context::PublishError),
    /// The server's `max_payload` does not change under a running stage.
    #[error(
        "the task record would be {size} bytes, more than the server takes ({limit} bytes with room for headers)"
    )]
    RecordTooLarge { size: usize, limit: usize },
}

impl Classify for Failed {
    fn verdict(&self) -> Verdict {
        match self {
            // Retrying would fail the same way and hold the TI's lane for ever.
            Failed::RecordTooLarge { .. } | Failed::Encode(_) => Verdict::Dead,
            Failed::Publish(error) => retry::publish_verdict(error),
            Failed::Load(_) | Failed::Store(_) | Failed::Lookup(_) => Verdict::Wait,
        }
    }
}

impl Worker {
    /// Where the processor's dead letters go.
    pub(super) fn dead_letters(&self) -> DeadLetters {
        DeadLetters {
            js: self.js.clone(),
            subjects: self.subjects.clone(),
            stage: Stage::Processor,
        }
    }

    /// Decides a group of one TI's events, in order and with one record write, retrying the
    /// group until it is done; then acks its events. Returns the TI's key with what it did.
    pub(super) async fn group(
        &self,
        key: String,
        group: Vec<PodDelivery>,
    ) -> (String, ProcessStats) {
        let mut stats = ProcessStats::default();
        let mut known = self.cache.take(&key).map(Known::Cached);
        let mut retrying = Retrying::new(Duration::from_millis(50), Duration::from_secs(5));
        loop {
            match self.decide(&key, &group, &mut known, &mut stats).await {
                Ok(Decided { commands, unsigned }) => {
                    stats.decided += group.len() as u64;
                    stats.commands += commands;
                    for delivery in &group {
                        ack(&delivery.message).await;
                    }
                    for (at, reason) in unsigned {
                        if let Some(delivery) = group.get(at) {
                            report_unsigned(&delivery.item.event, reason);
                        }
                    }
                    metrics::counter!(podstream_bus::metrics::PROCESSOR_EVENTS_DECIDED)
                        .increment(group.len() as u64);
                    self.health.set(Condition::ConsumerBound, true);
                    break;
                }
                Err(error) => {
                    known = Some(Known::Unsure);
                    let sequence = group.first().map_or(0, |d| d.sequence);
                    let reason = retry::with_causes(&error);
                    if error.verdict() == Verdict::Dead {
                        warn!(ti = %key, sequence, events = group.len(), %reason, "deciding events failed for good; dead-lettering them");
                        let to = self.dead_letters();
                        for delivery in &group {
                            dead_letter(&to, &delivery.message, delivery.sequence, reason.clone())
                                .await;
                        }
                        stats.dead_lettered += group.len() as u64;
                        known = None;
                        break;
                    }
                    metrics::counter!(podstream_bus::metrics::PROCESSOR_RETRIES).increment(1);
                    self.health.set(Condition::ConsumerBound, false);
                    warn!(ti = %key, sequence, events = group.len(), error = %reason,
                        retry_in_ms = retrying.delay().as_millis() as u64, "deciding events failed; retrying");
                    retrying.after(&error).await;
                }
            }
        }
        if let Some(Known::Cached(record)) = known {
            self.cache.put(key.clone(), record);
        }
        (key, stats)
    }

    /// Decides the group's events in order (and any earlier undecided event of their pods),
    /// writes the record once with compare-and-set, then publishes the commands. Returns how
    /// many were published, and which of the group's events were decided unsigned.
    async fn decide(
        &self,
        key: &str,
        group: &[PodDelivery],
        known: &mut Option<Known>,
        stats: &mut ProcessStats,
    ) -> Result<Decided, Failed> {
        let Some(first) = group.first() else {
            return Ok(Decided::default());
        };
        loop {
            let (mut record, revision, fresh) = match known.take() {
                Some(Known::Cached(Cached { record, revision })) => (record, revision, false),
                // A pod the ingest says is new nearly always means a new TI: try creating its
                // record, and read it only when that write finds one.
                None if first.item.event.previous_sequence == Some(0) => {
                    (TaskRecord::default(), 0, false)
                }
                None | Some(Known::Unsure) => {
                    stats.reads += 1;
                    let (record, revision) = self.load(key).await?;
                    (record, revision, true)
                }
            };
            // A record read from KV may hold commands whose publisher died before publishing.
            if fresh && !record.outbox.is_empty() {
                self.publish(&record.outbox).await?;
            }
            let mut commands = Vec::new();
            let mut unsigned = Vec::new();
            let mut changed = false;
            for (at, delivery) in group.iter().enumerate() {
                let uid = identity(&delivery.item.event)
                    .map(|(pod, _)| pod.uid.as_str())
                    .unwrap_or_default();
                let last = record.last_sequence(uid);
                if delivery.sequence <= last {
                    debug!(uid = %uid, ti = %key, sequence = delivery.sequence, "already decided");
                    continue;
                }
                changed = true;
                // Where the ingest says the pod's previous event is, and the record has decided
                // it: nothing earlier can be pending.
                let vouched = delivery.item.event.previous_sequence == Some(last);
                let earlier = if vouched {
                    Vec::new()
                } else {
                    stats.searches += 1;
                    self.earlier(uid, last, delivery.sequence).await?
                };
                for (sequence, earlier) in earlier {
                    let same_task =
                        identity(&earlier).is_ok_and(|(_, task)| TaskRecord::key(task) == key);
                    if same_task && let Ok(more) = record.apply(&self.rules, &earlier, sequence) {
                        debug!(uid = %uid, sequence, "decided an earlier event of the pod first");
                        commands.extend(more);
                    }
                }
                let (more, outcome) = record
                    .apply_noting(&self.rules, &delivery.item.event, delivery.sequence)
                    .unwrap_or_default();
                if let Some(Outcome::Ignored(Ignored::Unsigned(reason))) = outcome {
                    unsigned.push((at, reason));
                }
                commands.extend(more);
            }
            if !changed {
                *known = Some(Known::Cached(Cached { record, revision }));
                return Ok(Decided::default());
            }
            record.outbox = commands.clone();
            let bytes = record.encode().map_err(Failed::Encode)?;
            let limit = dead::body_limit(self.js.client().server_info().max_payload);
            if bytes.len() > limit {
                return Err(Failed::RecordTooLarge {
                    size: bytes.len(),
                    limit,
                });
            }
            match self.records.update(key, Bytes::from(bytes), revision).await {
                Ok(revision) => {
                    stats.writes += 1;
                    self.publish(&commands).await?;
                    *known = Some(Known::Cached(Cached { record, revision }));
                    return Ok(Decided {
                        commands: commands.len() as u64,
                        unsigned,
                    });
                }
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    debug!(ti = %key, "task record changed meanwhile; deciding again");
                    *known = Some(Known::Unsure);
                }
                Err(error) => return Err(Failed::Store(error)),
            }
        }
    }

    /// The record of `key` and its revision (0 when there is none yet).
    async fn load(&self, key: &str) -> Result<(TaskRecord, u64), Failed> {
        let entry = self.records.entry(key).await.map_err(Failed::Load)?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let record = TaskRecord::decode(&entry.value).unwrap_or_else(|error| {
                    // Not ours to lose sleep over: deciding from scratch re-emits at worst
                    // commands the sink already skips by id.
                    warn!(ti = %key, %error, "task record unreadable; starting it afresh");
                    TaskRecord::default()
                });
                Ok((record, entry.revision))
            }
            Some(entry) => Ok((TaskRecord::default(), entry.revision)),
            None => Ok((TaskRecord::default(), 0)),
        }
    }

    /// The pod's events (not notices) after sequence `after` and before `before`, in order.
    async fn earlier(
        &self,
        uid: &str,
        after: u64,
        before: u64,
    ) -> Result<Vec<(u64, PodEvent)>, Failed> {
        let subject = self.subjects.pod_events_of_any_owner(uid);
        let mut found = Vec::new();
        let mut next = after + 1;
        while next < before {
            let message = match self
                .pods
                .get_first_raw_message_by_subject(&subject, next)
                .await
            {
                Ok(message) => message,
                Err(error)
                    if error.kind() == jetstream::stream::RawMessageErrorKind::NoMessageFound =>
                {
                    break;
                }
                Err(error) => return Err(Failed::Lookup(error)),
            };
            if message.sequence >= before {
                break;
            }
            next = message.sequence + 1;
            if podstream_bus::role::is_left_notice(Some(&message.headers)) {
                continue;
            }
            if let Ok(event) = PodEvent::decode(message.payload.as_ref()) {
                found.push((message.sequence, event));
            }
        }
        Ok(found)
    }

    /// Publishes commands in order and waits for every ack.
    async fn publish(&self, commands: &[Command]) -> Result<(), Failed> {
        crate::publish::publish(&self.js, &self.subjects, commands)
            .await
            .map_err(Failed::Publish)
    }
}

/// What one instance knows of a TI's record before deciding its next event.
enum Known {
    /// The record as this instance last wrote or read it.
    Cached(Cached),
    /// Read it from KV: a write failed or lost a race.
    Unsure,
}

//! `podstream process`: pod events from JetStream → the rules → commands on JetStream.
//!
//! - **Work sharing and order.** One durable pull consumer per scheduler (`--scheduler 1,7`),
//!   or one on every owner. The consumer pins one instance at a time (JetStream priority
//!   group, `pinned_client`); other instances naming the same scheduler stand by and take over
//!   when the pinned one stops pulling (`failover`) or shuts down (it unpins). So a
//!   scheduler's events are decided in stream order: per pod, and across the pods of one task
//!   instance, which duplicate resolution needs (two pods of a TI decided by two instances at
//!   once could fail the TI on the loser's failure before the winner is known). Inside one
//!   instance, different task instances are decided concurrently (`--concurrency` at once),
//!   each as soon as it is free: one TI's events wait only for that TI ([`TaskLanes`]), and
//!   those that waited are decided together with one record write. Schedulers scale out.
//! - **State.** Nothing lives only in memory: each task instance has a KV record
//!   ([`TaskRecord`]) with its pods' states, written with compare-and-set. A lost race (two
//!   schedulers' consumers touching one TI, a takeover) reloads and decides again. The
//!   records an instance wrote last stay in a bounded cache ([`RecordCache`]) with their
//!   revisions, so a TI's next event needs no read. The TI of a pod the ingest says is new
//!   is taken to be new too, and its record created (compare-and-set on "no entry"), which
//!   fails, and reads, if it exists after all.
//! - **Per-pod order across consumers.** After a relabel a pod's events sit on two owners'
//!   subjects, pulled by two consumers. Before deciding an event at sequence `s`, the instance
//!   asks the stream for the pod's messages after the last one its record has decided (a
//!   wildcard lookup over every owner's subject of the pod) and decides any earlier one first;
//!   the instance that later receives an already decided event just acks it. The same covers
//!   the moment of a takeover, when the old instance may still hold unacked events. The
//!   lookup is skipped when the event itself says where the pod's previous event is
//!   (`previous_sequence`, from an ingest that knows) and that is the one the record last
//!   decided: nothing of the pod can lie between.
//! - **Crash recovery.** The consumer's ack wait is short (`--ack-wait-seconds`), so the events
//!   a crashed instance held are redelivered within seconds; a live instance keeps what it
//!   holds longer with progress acks ([`InFlight`]). A starting instance unpins the consumer
//!   and resets it to its ack floor, so a restart waits neither for the dead instance's pin
//!   nor for its events' ack wait. (The sink cannot: sinks share a consumer, and a reset
//!   would hand a live sink's commands to another while it applies them.)
//! - **Exactly once in effect.** Commands carry deterministic `Nats-Msg-Id`s and are stored in
//!   the record's outbox by the same write as the state; a pod event is acked only after its
//!   commands are acked.

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, AckKind, consumer::pull, kv, stream};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt};
use podstream_bus::Backoff;
use podstream_bus::BusConfig;
use podstream_bus::dead::{self, DeadLetter};
use podstream_bus::in_flight::{Held, InFlight};
use podstream_bus::streams;
use podstream_bus::{Condition, Health};
use podstream_proto::PodEvent;
use podstream_proto::subject::{Role, Stage, Stream, Subjects, encode_token};
use podstream_proto::v1::Command;
use podstream_proto::v1::command::Kind;
use prost::Message as _;
use tracing::{debug, info, warn};

use crate::decide::identity;
use crate::record::TaskRecord;
use crate::record_cache::{Cached, RecordCache};
use crate::rules::Rules;
use crate::spark_service::{SparkWorker, open_spark_bucket, spark_consumer};
use crate::task_lanes::{self, TaskLanes};

/// How the processor runs.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// The NATS server, the subject prefix, the settings of the streams and the bucket.
    pub bus: BusConfig,
    /// Schedulers (owners) to process; empty means every owner.
    pub schedulers: Vec<String>,
    /// Durable consumer name, suffixed with the scheduler when `schedulers` is set.
    pub consumer: String,
    /// The KV bucket of task records.
    pub bucket: String,
    /// The rules.
    pub rules: Rules,
    /// Pod events fetched at once per consumer.
    pub batch_size: usize,
    /// Task instances decided at once (each as soon as it is free).
    pub concurrency: usize,
    /// How long a silent instance keeps its consumer before a standby takes over.
    pub failover: Duration,
    /// How long the consumer waits for an event's ack before redelivering it: how soon a
    /// crashed instance's events are decided again (held ones get progress acks).
    pub ack_wait: Duration,
    /// Task records kept in memory with their KV revisions (0: read each one from KV).
    pub cached_records: usize,
    /// The KV bucket of Spark records, when Spark driver pods are processed too
    /// (`--spark`, see [`crate::spark_service`]); `None` leaves them alone.
    pub spark_bucket: Option<String>,
    /// Readiness: the consumers bound, the last decision not failing.
    pub health: Health,
}

/// The durable consumer's name by default (and the bucket's).
pub const DEFAULT_CONSUMER: &str = "podstream-process";
/// The KV bucket of task records by default.
pub const DEFAULT_BUCKET: &str = "podstream-process";
/// The role in the name of a prefix's processor bucket (`<prefix>-process`, see
/// [`podstream_proto::subject::Subjects::resource_name`]).
pub const BUCKET_ROLE: &str = "process";
/// Pod events fetched at once per consumer, by default.
pub const DEFAULT_BATCH_SIZE: usize = 256;
/// Task instances decided at once, by default.
pub const DEFAULT_CONCURRENCY: usize = 64;
/// Seconds a silent instance keeps its consumer before a standby takes over, by default.
pub const DEFAULT_FAILOVER_SECONDS: u64 = 5;
/// Task records kept in memory, by default.
pub const DEFAULT_CACHED_RECORDS: usize = 8_192;

/// The priority group every processor pulls in; the server pins one instance per consumer.
const PRIORITY_GROUP: &str = "podstream";

impl Default for ProcessConfig {
    fn default() -> Self {
        ProcessConfig {
            bus: BusConfig::default(),
            schedulers: Vec::new(),
            consumer: DEFAULT_CONSUMER.into(),
            bucket: DEFAULT_BUCKET.into(),
            rules: Rules::default(),
            batch_size: DEFAULT_BATCH_SIZE,
            concurrency: DEFAULT_CONCURRENCY,
            failover: Duration::from_secs(DEFAULT_FAILOVER_SECONDS),
            ack_wait: podstream_bus::config::default_ack_wait(),
            cached_records: DEFAULT_CACHED_RECORDS,
            spark_bucket: None,
            health: Health::new(),
        }
    }
}

/// Counters reported when the processor stops.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStats {
    /// Pod events decided.
    pub decided: u64,
    /// Commands published.
    pub commands: u64,
    /// Pod events that were dead-lettered.
    pub dead_lettered: u64,
    /// Searches of the stream for earlier undecided events of a pod (the ingest could not
    /// vouch for the pod's previous event).
    pub searches: u64,
    /// Task records read from KV (not in the cache, or changed by another instance).
    pub reads: u64,
    /// Task records written: one per group of a TI's events decided together.
    pub writes: u64,
}

impl std::ops::AddAssign for ProcessStats {
    fn add_assign(&mut self, other: ProcessStats) {
        self.decided += other.decided;
        self.commands += other.commands;
        self.dead_lettered += other.dead_lettered;
        self.searches += other.searches;
        self.reads += other.reads;
        self.writes += other.writes;
    }
}

impl std::fmt::Display for ProcessStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "decided {}, commands {}, dead-lettered {}, searches for earlier events {}, records read {}, records written {}",
            self.decided, self.commands, self.dead_lettered, self.searches, self.reads, self.writes
        )
    }
}

/// Runs until `shutdown` resolves; the batches in hand are finished first.
pub async fn run(
    config: ProcessConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<ProcessStats> {
    let subjects = config.bus.subjects().context("invalid --prefix")?;
    config.health.declare(Condition::ConsumerBound);
    let nats = podstream_bus::connect(
        &config.bus.nats_url,
        &config.bus.security,
        "podstream-process",
    )
    .await?;
    let js = jetstream::new(nats);
    let pods = streams::ensure(
        &js,
        streams::stream_config(&subjects, Stream::PodEvents, &config.bus.streams),
    )
    .await?;
    streams::ensure(
        &js,
        streams::stream_config(&subjects, Stream::Commands, &config.bus.streams),
    )
    .await?;
    streams::ensure(
        &js,
        streams::stream_config(&subjects, Stream::DeadLetters, &config.bus.streams),
    )
    .await?;
    let records = open_bucket(&js, &config, &pods).await?;
    let pods = streams::while_unavailable(&pods.name, || js.get_stream(&pods.name))
        .await
        .context("opening the pod-events stream")?;

    let mut consumers = Vec::new();
    let scopes: Vec<Option<&str>> = if config.schedulers.is_empty() {
        vec![None]
    } else {
        config.schedulers.iter().map(|s| Some(s.as_str())).collect()
    };
    for scope in scopes {
        let name = match scope {
            None => config.consumer.clone(),
            Some(owner) => format!("{}-{}", config.consumer, encode_token(owner)),
        };
        // Created or updated, so a changed ack wait or failover reaches an existing consumer.
        let wanted = pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: subjects.pod_events_filter(scope),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            max_ack_pending: 10_000,
            // One instance at a time pulls a consumer; the others stand by.
            priority_policy: jetstream::consumer::PriorityPolicy::PinnedClient,
            priority_groups: vec![PRIORITY_GROUP.to_owned()],
            priority_timeout: config.failover,
            ..Default::default()
        };
        let consumer: jetstream::consumer::PullConsumer =
            streams::while_unavailable(&name, || pods.create_consumer(wanted.clone()))
                .await
                .with_context(|| format!("creating consumer {name}"))?;
        // A start is most often a restart after a crash, whose pin would keep the consumer
        // for --failover-seconds: take it now. A live pinned instance hands over once, which
        // per-pod order allows (see the module doc).
        if let Err(error) = pods.unpin_consumer(&name, PRIORITY_GROUP).await {
            debug!(%error, consumer = %name, "unpin on start failed; waiting for the pin to time out");
        }
        // And back to its ack floor: what a dead instance held is delivered again now, not
        // after the ack wait. What a live one holds too is decided twice at worst, which the
        // records make a no-op. Servers before NATS 2.14 refuse; the ack wait then applies.
        if let Err(error) = pods.reset_consumer(&name, None).await {
            debug!(%error, consumer = %name, "consumer reset on start refused; in-flight events come back after the ack wait");
        }
        info!(consumer = %name, filter = %subjects.pod_events_filter(scope), "processing");
        consumers.push(consumer);
    }

    let spark = match &config.spark_bucket {
        Some(bucket) => {
            let wanted = streams::stream_config(&subjects, Stream::Spark, &config.bus.streams);
            let spark = streams::ensure(&js, wanted).await?;
            let records = open_spark_bucket(&js, bucket, &spark).await?;
            let stream = streams::while_unavailable(&spark.name, || js.get_stream(&spark.name))
                .await
                .context("opening the Spark stream")?;
            let consumer = spark_consumer(
                &stream,
                &format!("{}-spark", config.consumer),
                subjects.stream_subjects(Stream::Spark),
                config.ack_wait,
                config.failover,
            )
            .await?;
            Some((stream, consumer, records))
        }
        None => None,
    };

    let lag = podstream_bus::metrics::report_pending(consumers.clone());
    let worker = Worker {
        in_flight: InFlight::start(js.client(), config.ack_wait),
        js,
        pods: pods.clone(),
        records,
        cache: RecordCache::new(config.cached_records),
        subjects,
        rules: config.rules.clone(),
        health: config.health.clone(),
    };
    config.health.set(Condition::ConsumerBound, true);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let loops = consumers.into_iter().map(|consumer| {
        let worker = &worker;
        let pods = &pods;
        let config = &config;
        let stopped = stopped.clone();
        async move {
            let mut stats = ProcessStats::default();
            let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
            while !*stopped.borrow() {
                match worker.consume(&consumer, config, stopped.clone(), &mut stats).await {
                    Ok(()) => break,
                    Err(error) => {
                        worker.health.set(Condition::ConsumerBound, false);
                        warn!(%error, consumer = %consumer.cached_info().name, "pulling pod events failed; retrying");
                        backoff.wait().await;
                    }
                }
            }
            // Hand the pin to a standby instance now rather than after the priority timeout.
            let name = consumer.cached_info().name.clone();
            if let Err(error) = pods.unpin_consumer(&name, PRIORITY_GROUP).await {
                debug!(%error, consumer = %name, "unpin on shutdown failed; the pin times out");
            }
            stats
        }
    });
    let spark_loop = async {
        let Some((stream, consumer, records)) = &spark else {
            return ProcessStats::default();
        };
        let worker = SparkWorker {
            js: worker.js.clone(),
            subjects: worker.subjects.clone(),
            records: records.clone(),
            health: config.health.clone(),
        };
        let mut stats = ProcessStats::default();
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        while !*stopped.borrow() {
            match worker
                .consume(consumer, config.failover, stopped.clone(), &mut stats)
                .await
            {
                Ok(()) => break,
                Err(error) => {
                    warn!(%error, "pulling Spark events failed; retrying");
                    backoff.wait().await;
                }
            }
        }
        let name = consumer.cached_info().name.clone();
        if let Err(error) = stream.unpin_consumer(&name, PRIORITY_GROUP).await {
            debug!(%error, consumer = %name, "unpin on shutdown failed; the pin times out");
        }
        stats
    };
    let all = futures::future::join(futures::future::join_all(loops), spark_loop);
    tokio::pin!(all);
    tokio::pin!(shutdown);
    let (per_consumer, spark_stats) = tokio::select! {
        stats = &mut all => stats,
        _ = &mut shutdown => {
            let _ = stop.send(true);
            all.await
        }
    };
    lag.abort();
    let mut stats = spark_stats;
    for one in per_consumer {
        stats += one;
    }
    info!(%stats, "processor stopped");
    Ok(stats)
}

/// The bucket of task records, kept as long and as replicated as the pod-events stream `pods`.
async fn open_bucket(
    js: &jetstream::Context,
    config: &ProcessConfig,
    pods: &stream::Config,
) -> anyhow::Result<kv::Store> {
    let wanted = kv::Config {
        bucket: config.bucket.clone(),
        description: "podstream processor: per task instance, its pods' states".into(),
        history: 1,
        // Records of TIs without events for this long go; no event older can be redelivered.
        max_age: pods.max_age,
        storage: stream::StorageType::File,
        num_replicas: pods.num_replicas,
        ..Default::default()
    };
    streams::bucket(js, wanted)
        .await
        .with_context(|| format!("opening KV bucket {}", config.bucket))
}

/// A pod event taken off the consumer.
struct Delivery {
    message: Held,
    sequence: u64,
    event: PodEvent,
    key: String,
}

/// What every consumer loop shares.
struct Worker {
    js: jetstream::Context,
    /// Every event pulled and not yet acked, kept from redelivery while it is decided.
    in_flight: InFlight,
    pods: stream::Stream,
    records: kv::Store,
    cache: RecordCache,
    subjects: Subjects,
    rules: Rules,
    health: Health,
}

/// Why deciding an event must be retried.
#[derive(Debug, thiserror::Error)]
enum Retry {
    #[error("reading task record: {0}")]
    Load(String),
    #[error("writing task record: {0}")]
    Store(String),
    #[error("looking up earlier events of the pod: {0}")]
    Lookup(String),
    #[error("publishing commands: {0}")]
    Publish(String),
}

impl Worker {
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
        warn!(subject = %message.subject, sequence, %reason, "pod event dead-lettered");
        let letter = DeadLetter {
            subject: self.subjects.dead_letters(Stage::Processor),
            msg_id: format!("processor:{}:{sequence}", message.subject),
            reason,
            source: message.subject.to_string(),
            payload: message.payload.clone(),
        };
        dead::store(&self.js, &letter).await;
        ack(&message).await;
        Accepted::Dead
    }

    /// Decides a group of one TI's events, in order and with one record write, retrying the
    /// group until it is done; then acks its events. Returns the TI's key with what it did.
    async fn group(&self, key: String, group: Vec<Delivery>) -> (String, ProcessStats) {
        let mut stats = ProcessStats::default();
        let mut known = self.cache.take(&key).map(Known::Cached);
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
        loop {
            match self.decide(&key, &group, &mut known, &mut stats).await {
                Ok(commands) => {
                    stats.decided += group.len() as u64;
                    stats.commands += commands;
                    for delivery in &group {
                        ack(&delivery.message).await;
                    }
                    metrics::counter!(podstream_bus::metrics::PROCESSOR_EVENTS_DECIDED)
                        .increment(group.len() as u64);
                    self.health.set(Condition::ConsumerBound, true);
                    break;
                }
                Err(error) => {
                    known = Some(Known::Unsure);
                    metrics::counter!(podstream_bus::metrics::PROCESSOR_RETRIES).increment(1);
                    self.health.set(Condition::ConsumerBound, false);
                    let sequence = group.first().map_or(0, |d| d.sequence);
                    warn!(%error, ti = %key, sequence, events = group.len(),
                        retry_in_ms = backoff.delay().as_millis() as u64, "deciding events failed; retrying");
                    backoff.wait().await;
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
    /// many were published.
    async fn decide(
        &self,
        key: &str,
        group: &[Delivery],
        known: &mut Option<Known>,
        stats: &mut ProcessStats,
    ) -> Result<u64, Retry> {
        let Some(first) = group.first() else {
            return Ok(0);
        };
        loop {
            let (mut record, revision, fresh) = match known.take() {
                Some(Known::Cached(Cached { record, revision })) => (record, revision, false),
                // A pod the ingest says is new nearly always means a new TI: try creating its
                // record, and read it only when that write finds one.
                None if first.event.previous_sequence == Some(0) => {
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
            let mut changed = false;
            for delivery in group {
                let uid = identity(&delivery.event)
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
                let vouched = delivery.event.previous_sequence == Some(last);
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
                let more = record
                    .apply(&self.rules, &delivery.event, delivery.sequence)
                    .unwrap_or_default();
                commands.extend(more);
            }
            if !changed {
                *known = Some(Known::Cached(Cached { record, revision }));
                return Ok(0);
            }
            record.outbox = commands.clone();
            let bytes = record.encode().map_err(|e| Retry::Store(e.to_string()))?;
            match self.records.update(key, Bytes::from(bytes), revision).await {
                Ok(revision) => {
                    stats.writes += 1;
                    self.publish(&commands).await?;
                    *known = Some(Known::Cached(Cached { record, revision }));
                    return Ok(commands.len() as u64);
                }
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                    debug!(ti = %key, "task record changed meanwhile; deciding again");
                    *known = Some(Known::Unsure);
                }
                Err(error) => return Err(Retry::Store(error.to_string())),
            }
        }
    }

    /// The record of `key` and its revision (0 when there is none yet).
    async fn load(&self, key: &str) -> Result<(TaskRecord, u64), Retry> {
        let entry = self
            .records
            .entry(key)
            .await
            .map_err(|e| Retry::Load(e.to_string()))?;
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
    ) -> Result<Vec<(u64, PodEvent)>, Retry> {
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
                Err(error) => return Err(Retry::Lookup(error.to_string())),
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
    async fn publish(&self, commands: &[Command]) -> Result<(), Retry> {
        publish(&self.js, &self.subjects, commands)
            .await
            .map_err(Retry::Publish)
    }
}

/// Publishes commands in order on their owners' subjects (a transfer also on its previous
/// owner's, marked `left`) and waits for every ack.
pub(crate) async fn publish(
    js: &jetstream::Context,
    subjects: &Subjects,
    commands: &[Command],
) -> Result<(), String> {
    let mut acks = Vec::with_capacity(commands.len());
    for command in commands {
        let uid = command.pod.as_ref().map_or("", |p| p.uid.as_str());
        let payload = Bytes::from(command.encode_to_vec());
        // A transfer is also the previous owner's news (its executor frees the slot):
        // a copy on its subject, marked `left`, which the sink does not apply again.
        if let Some(Kind::Transfer(transfer)) = &command.kind
            && transfer.from != command.owner
        {
            // Headers first: `headers` replaces the map `message_id` writes into.
            let notice = jetstream::message::PublishMessage::build()
                .headers(podstream_bus::role::headers(Role::Left))
                .message_id(format!("{}:{}", command.id, Role::Left.as_str()))
                .payload(payload.clone());
            let subject = subjects.commands(&transfer.from, uid);
            let ack = js.send_publish(subject, notice).await;
            acks.push(ack.map_err(|e| e.to_string())?);
        }
        let subject = subjects.commands(&command.owner, uid);
        let message = jetstream::message::PublishMessage::build()
            .headers(podstream_bus::role::headers(Role::Event))
            .message_id(&command.id)
            .payload(payload);
        let ack = js
            .send_publish(subject, message)
            .await
            .map_err(|e| e.to_string())?;
        let kind = command.kind.as_ref().map_or("none", |k| k.name());
        metrics::counter!(podstream_bus::metrics::PROCESSOR_COMMANDS, "kind" => kind).increment(1);
        // Fields are evaluated only when the event is enabled: no TI string at warn level.
        info!(
            pod = %uid,
            ti = %command.task.as_ref().map(ToString::to_string).unwrap_or_default(),
            owner = %command.owner,
            kind = command.kind.as_ref().map_or("none", |k| k.name()),
            id = %command.id,
            "command"
        );
        acks.push(ack);
    }
    for ack in acks {
        ack.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What one instance knows of a TI's record before deciding its next event.
enum Known {
    /// The record as this instance last wrote or read it.
    Cached(Cached),
    /// Read it from KV: a write failed or lost a race.
    Unsure,
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

async fn ack(message: &jetstream::Message) {
    if let Err(error) = message.ack_with(AckKind::Ack).await {
        // Redelivered then, and found already decided.
        warn!(%error, "ack failed; the event will be redelivered and skipped");
    }
}

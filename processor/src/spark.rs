//! The processor's Spark consumer (`podstream process --spark`): Spark driver pods' and
//! SparkApplications' events from the Spark stream → the records of
//! [`podstream_rules::spark`], kept in a KV bucket → `duplicate` commands on the commands
//! stream, and each job's choice in its record, where `PodstreamSparkKubernetesOperator`
//! reads it.
//!
//! One durable consumer pinned to one instance at a time (as the pod consumers are), read
//! one event at a time: Spark objects are few, and a job's records then change in stream
//! order. Records are written by compare-and-set, so an instance taking over mid-event
//! decides again from what is stored. Each record keeps the commands of its last decision
//! (its outbox), published again whenever the record is read: an event whose record was
//! written but whose commands were not published before a crash loses nothing, and the
//! commands' deterministic ids make the copies harmless.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use podstream_bus::consume::{
    ConsumerLoop, DeadLetters, Decoded, Delivery, Handler, HandlerStopped, Pulling, Sharing, ack,
    dead_letter,
};
use podstream_bus::pinned::{self, Pinned};
use podstream_bus::retry::{self, Classify, Retrying, Verdict};
use podstream_bus::streams;
use podstream_bus::{Condition, Health, StageError};
use podstream_proto::subject::{Stage, Subjects};
use podstream_proto::v1::spark_event::Object;
use podstream_proto::v1::{EventType, SparkApplication, SparkDriver, SparkEvent};
use podstream_rules::spark::{
    ApplicationRecord, JobKey, JobRecord, application_kv_key, application_name,
};
use prost::Message as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::publish::publish;
use crate::stats::ProcessStats;

/// The KV bucket of Spark records by default.
pub const DEFAULT_SPARK_BUCKET: &str = "podstream-spark";
/// The role in the name of a prefix's Spark bucket (`<prefix>-spark`).
pub const SPARK_ROLE: &str = "spark";

/// Why deciding a Spark event failed, with the cause's own type.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("reading {0}")]
    Load(String, #[source] kv::EntryError),
    #[error("encoding {0}")]
    Encode(String, #[source] serde_json::Error),
    #[error("writing {0}")]
    Store(String, #[source] kv::UpdateError),
    #[error("removing {0}")]
    Remove(String, #[source] kv::DeleteError),
    #[error("{0} changed meanwhile")]
    Moved(String),
    #[error("publishing commands")]
    Publish(#[source] jetstream::context::PublishError),
}

impl Classify for Failed {
    fn verdict(&self) -> Verdict {
        match self {
            Failed::Moved(_) => Verdict::Again,
            Failed::Encode(..) => Verdict::Dead,
            Failed::Publish(error) => retry::publish_verdict(error),
            Failed::Load(..) | Failed::Store(..) | Failed::Remove(..) => Verdict::Wait,
        }
    }
}

/// The Spark consumer: the bus's consumer loop on its pinned consumer, and what deciding
/// needs. The one seam between the processor's service and Spark: [`SparkConsumer::start`]
/// and [`SparkConsumer::run`].
pub struct SparkConsumer {
    consumer: ConsumerLoop,
    worker: SparkWorker,
}

impl SparkConsumer {
    /// The bucket of records opened beside the Spark stream `spark` (made ready by the
    /// processor's start) and the pinned consumer `pinned` bound, pulled as `pulling` says.
    pub async fn start(
        js: &jetstream::Context,
        subjects: &Subjects,
        spark: &stream::Config,
        bucket: &str,
        pinned: Pinned<'_>,
        pulling: Pulling,
    ) -> Result<SparkConsumer, StageError> {
        let description =
            "podstream processor: per Spark job, its driver pods and the driver chosen";
        // Kept as long and as replicated as the Spark stream.
        let records = streams::bucket_beside(js, bucket, description, spark)
            .await
            .map_err(|source| StageError::Bucket {
                bucket: bucket.to_owned(),
                source,
            })?;
        let stream = streams::while_unavailable(&spark.name, || js.get_stream(&spark.name))
            .await
            .map_err(|source| StageError::Stream {
                stream: spark.name.clone(),
                source,
            })?;
        let failover = pinned.failover;
        let consumer = pinned::bind(&stream, pinned).await?;
        let dead = DeadLetters {
            js: js.clone(),
            subjects: subjects.clone(),
            stage: Stage::Processor,
        };
        let worker = SparkWorker {
            js: js.clone(),
            subjects: subjects.clone(),
            records,
            health: pulling.health.clone(),
            dead: dead.clone(),
        };
        Ok(SparkConsumer {
            consumer: ConsumerLoop {
                consumer,
                sharing: Sharing::Pinned {
                    stream: Box::new(stream),
                    failover,
                },
                pulling,
                dead,
            },
            worker,
        })
    }

    /// Runs the consumer loop until `stopped`, then lets the pin go.
    pub async fn run(&self, stopped: tokio::sync::watch::Receiver<bool>) -> ProcessStats {
        let mut handler = SparkHandler {
            worker: &self.worker,
            running: None,
            stats: ProcessStats::default(),
        };
        match self.consumer.run(&mut handler, stopped).await {
            Ok(consumed) => handler.stats.dead_lettered += consumed.dead_lettered,
            Err(error) => warn!(%error, "the Spark consumer stopped"),
        }
        handler.stats
    }
}

/// Decides Spark events one at a time, in stream order: Spark objects are few, and a job's
/// records then change in stream order.
struct SparkHandler<'w> {
    worker: &'w SparkWorker,
    /// The events taken last, being decided in order.
    running: Option<BoxFuture<'w, ProcessStats>>,
    stats: ProcessStats,
}

impl<'w> Handler for SparkHandler<'w> {
    type Item = SparkEvent;
    type Done = ProcessStats;

    fn decode(&self, message: &jetstream::Message) -> Decoded<SparkEvent> {
        match SparkEvent::decode(message.payload.as_ref()) {
            Ok(event) if event.object.is_some() => Decoded::Item(event),
            Ok(_) => Decoded::Dead("a SparkEvent without an object".to_owned()),
            Err(error) => Decoded::Dead(format!("not a SparkEvent: {error}")),
        }
    }

    fn has_room(&self) -> bool {
        self.running.is_none()
    }

    async fn take(&mut self, deliveries: Vec<Delivery<SparkEvent>>) -> Result<(), HandlerStopped> {
        let worker: &'w SparkWorker = self.worker;
        self.running = Some(
            async move {
                let mut stats = ProcessStats::default();
                for delivery in &deliveries {
                    worker.handle_until_done(delivery, &mut stats).await;
                }
                stats
            }
            .boxed(),
        );
        Ok(())
    }

    async fn finished(&mut self) -> Option<ProcessStats> {
        let stats = self.running.as_mut()?.await;
        self.running = None;
        Some(stats)
    }

    async fn after(&mut self, stats: ProcessStats) {
        self.stats += stats;
    }
}

/// What deciding Spark events needs.
struct SparkWorker {
    js: jetstream::Context,
    subjects: Subjects,
    records: kv::Store,
    health: Health,
    dead: DeadLetters,
}

/// A record and the KV revision it was read at (0: none yet).
struct Stored<T> {
    record: T,
    revision: u64,
}

impl SparkWorker {
    /// Decides one event, retrying while KV or the commands stream are away (the consumer
    /// loop keeps the message from redelivery meanwhile), then acks it; an event that cannot
    /// be decided is dead-lettered.
    async fn handle_until_done(&self, delivery: &Delivery<SparkEvent>, stats: &mut ProcessStats) {
        let mut retrying = Retrying::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let error = match self.handle(&delivery.item).await {
                Ok(commands) => {
                    self.health.set(Condition::ConsumerBound, true);
                    stats.decided += 1;
                    stats.commands += commands;
                    ack(&delivery.message).await;
                    return;
                }
                Err(error) => error,
            };
            let reason = retry::with_causes(&error);
            match error.verdict() {
                Verdict::Again => debug!(%reason, "Spark record changed meanwhile; deciding again"),
                Verdict::Wait => {
                    self.health.set(Condition::ConsumerBound, false);
                    warn!(%reason, subject = %delivery.message.subject, retry_in_ms = retrying.delay().as_millis() as u64, "deciding a Spark event failed; retrying");
                }
                Verdict::Dead => {
                    dead_letter(&self.dead, &delivery.message, delivery.sequence, reason).await;
                    stats.dead_lettered += 1;
                    return;
                }
            }
            retrying.after(&error).await;
        }
    }

    /// Decides one event; the number of commands published.
    async fn handle(&self, event: &SparkEvent) -> Result<u64, Failed> {
        match &event.object {
            Some(Object::Driver(driver)) => self.driver(event, driver).await,
            Some(Object::Application(application)) => self.application(event, application).await,
            None => Ok(0),
        }
    }

    async fn driver(&self, event: &SparkEvent, driver: &SparkDriver) -> Result<u64, Failed> {
        let job = JobKey::of(driver);
        let key = job.kv_key();
        let mut stored: Stored<JobRecord> = self.load(&key).await?;
        let mut published = self.publish(&stored.record.outbox).await?;
        let before: Vec<String> = owned(stored.record.applications());
        if !stored.record.take_driver(event, driver) {
            return Ok(published);
        }
        let now: Vec<String> = owned(stored.record.applications());
        for name in &now {
            if !before.contains(name) {
                self.index(&job, name, true).await?;
            }
        }
        for name in &before {
            if !now.contains(name) {
                self.index(&job, name, false).await?;
            }
        }
        let applications = self.applications_of(&job, &now).await?;
        stored
            .record
            .decide(|name| applications.get(name), &event.resource_version);
        let outbox = stored.record.outbox.clone();
        if stored.record.drivers.is_empty() {
            self.remove(&key, stored.revision).await?;
        } else {
            self.store(&key, &stored.record, stored.revision).await?;
        }
        published += self.publish(&outbox).await?;
        Ok(published)
    }

    async fn application(
        &self,
        event: &SparkEvent,
        application: &SparkApplication,
    ) -> Result<u64, Failed> {
        let (namespace, name) = application_name(application);
        let key = application_kv_key(&namespace, &name);
        let mut stored: Stored<ApplicationRecord> = self.load(&key).await?;
        // Its jobs are decided again even for an event taken before: a crash may have come
        // between this record's write and theirs.
        if event.r#type() == EventType::Deleted {
            if stored.revision != 0 {
                self.remove(&key, stored.revision).await?;
            }
        } else if stored.record.take(event, application) {
            self.store(&key, &stored.record, stored.revision).await?;
        }
        let mut published = 0;
        for job in &stored.record.jobs {
            let job_key = job.kv_key();
            let mut record: Stored<JobRecord> = self.load(&job_key).await?;
            published += self.publish(&record.record.outbox).await?;
            if record.revision == 0 {
                continue;
            }
            let names = owned(record.record.applications());
            let applications = self.applications_of(job, &names).await?;
            record
                .record
                .decide(|name| applications.get(name), &event.resource_version);
            let outbox = record.record.outbox.clone();
            self.store(&job_key, &record.record, record.revision)
                .await?;
            published += self.publish(&outbox).await?;
        }
        Ok(published)
    }

    /// Adds `job` to (or, `named` false, removes it from) the jobs application `name` knows.
    async fn index(&self, job: &JobKey, name: &str, named: bool) -> Result<(), Failed> {
        let key = application_kv_key(&job.namespace, name);
        let mut stored: Stored<ApplicationRecord> = self.load(&key).await?;
        if named {
            if stored.record.named_by(job) {
                self.store(&key, &stored.record, stored.revision).await?;
            }
        } else if stored.revision != 0 {
            if stored.record.forget(job) {
                self.remove(&key, stored.revision).await?;
            } else {
                self.store(&key, &stored.record, stored.revision).await?;
            }
        }
        Ok(())
    }

    /// The records of the applications `names` of `job`'s namespace that exist.
    async fn applications_of(
        &self,
        job: &JobKey,
        names: &[String],
    ) -> Result<HashMap<String, ApplicationRecord>, Failed> {
        let mut found = HashMap::new();
        for name in names {
            let stored: Stored<ApplicationRecord> =
                self.load(&application_kv_key(&job.namespace, name)).await?;
            if stored.revision != 0 {
                found.insert(name.clone(), stored.record);
            }
        }
        Ok(found)
    }

    async fn load<T: DeserializeOwned + Default>(&self, key: &str) -> Result<Stored<T>, Failed> {
        let entry = self
            .records
            .entry(key)
            .await
            .map_err(|e| Failed::Load(key.to_owned(), e))?;
        Ok(match entry {
            Some(entry) if entry.operation == kv::Operation::Put => Stored {
                record: serde_json::from_slice(&entry.value).unwrap_or_else(|error| {
                    // Decided afresh from its next events: at worst a duplicate reported again.
                    warn!(%key, %error, "Spark record unreadable; starting it afresh");
                    T::default()
                }),
                revision: entry.revision,
            },
            Some(entry) => Stored {
                record: T::default(),
                revision: entry.revision,
            },
            None => Stored {
                record: T::default(),
                revision: 0,
            },
        })
    }

    async fn store<T: Serialize>(
        &self,
        key: &str,
        record: &T,
        revision: u64,
    ) -> Result<(), Failed> {
        let value = serde_json::to_vec(record).map_err(|e| Failed::Encode(key.to_owned(), e))?;
        match self.records.update(key, Bytes::from(value), revision).await {
            Ok(_) => Ok(()),
            Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(Failed::Moved(key.to_owned()))
            }
            Err(error) => Err(Failed::Store(key.to_owned(), error)),
        }
    }

    async fn remove(&self, key: &str, revision: u64) -> Result<(), Failed> {
        match self
            .records
            .delete_expect_revision(key, Some(revision))
            .await
        {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == kv::DeleteErrorKind::WrongLastRevision => {
                Err(Failed::Moved(key.to_owned()))
            }
            Err(error) => Err(Failed::Remove(key.to_owned(), error)),
        }
    }

    async fn publish(&self, commands: &[podstream_proto::Command]) -> Result<u64, Failed> {
        if commands.is_empty() {
            return Ok(0);
        }
        publish(&self.js, &self.subjects, commands)
            .await
            .map_err(Failed::Publish)?;
        for command in commands {
            info!(id = %command.id, pod = %command.pod.as_ref().map(|p| p.name.as_str()).unwrap_or_default(), "Spark duplicate reported");
        }
        Ok(commands.len() as u64)
    }
}

fn owned(names: Vec<&str>) -> Vec<String> {
    names.into_iter().map(str::to_owned).collect()
}

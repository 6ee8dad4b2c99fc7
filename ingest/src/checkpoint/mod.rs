//! The ingest's checkpoint in a JetStream KV bucket: per pod the last published `PodEvent`
//! (its owner and the facts the rules read; never the `Pod`), and the last published
//! resourceVersion. Written only for acked events, so it never claims more than was published.
//!
//! Pods are kept in [`SHARDS`] keys (`pods.0000` … `pods.1023`, a pod's shard by a hash of
//! its uid), each holding the last events of its pods, and a shard is rewritten whole when
//! one of its pods changed, at most once per write interval. One key per pod made every event
//! cost JetStream a second stored message, which capped the ingest near half the publish
//! limit; with shards, an initial list of 100k pods costs one write of each shard per
//! interval. The price is bytes: a busy second rewrites every shard (the whole checkpoint,
//! ~17 MB at 100k pods), so the interval should stay well under the duplicate window
//! (everything published since the last write is published again after a crash, and only the
//! window makes that harmless) but not far under a second.
//!
//! A shard never exceeds what the server takes in one message (`max_payload`, less room for
//! headers): one whose pods do not fit continues in parts, `pods.0007.1`, `pods.0007.2`, …,
//! each written like the shard itself; a part no longer needed is written empty.
//!
//! With `--spark`, the last events of the Spark objects (driver pods and SparkApplications)
//! share one more key, `spark`, written the same way.
//!
//! Every write is a compare-and-set on the key's KV revision, and every batch starts by
//! setting the `leader` key (the writer's term and identity) at the revision this writer last
//! left it. An ingest that claimed the checkpoint after this one makes the next batch fail,
//! and a writer that finds its revisions stale stops as [`Deposed`]: two ingests can never
//! interleave their shards.
//!
//! - `shards`: which shard a pod falls in, and a shard's value (pure);
//! - [`write`]: one write, by compare-and-set, and what a failed one leaves;
//! - `leader`: the `leader` key, read with patience and checked after a key moved.

mod leader;
mod shards;
mod write;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::StreamExt;
use podstream_proto::PodEvent;
use podstream_proto::v1::{EventType, SparkEvent};
use prost::Message as _;

use crate::known::{FastHash, Outgoing, Role, uid};
use crate::leadership::{Deposed, Fence};
use crate::spark::SparkOutgoing;
use leader::read_leader;
use shards::{SHARD_PREFIX, shard_and_part};
pub use shards::{SHARDS, ShardUnreadable, decode_shard, encode_parts, encode_shard, shard_of};
use write::{ShardWrite, Write, WriteFailed, Written, write_out};

/// Key holding the last published resourceVersion.
const RESUME_KEY: &str = "resume";
/// Key holding the term and identity of the ingest that writes the checkpoint.
const LEADER_KEY: &str = "leader";
/// Key holding the last published event of every Spark object (`--spark`), in one value:
/// Spark objects are few.
const SPARK_KEY: &str = "spark";
/// The KV revision of a key that does not exist: a compare-and-set expecting no value.
const ABSENT: u64 = 0;
/// The smallest part the server's `max_payload` can leave (a server configured tiny).
const MIN_PART_LIMIT: usize = 1024;

/// Why the checkpoint could not be opened, claimed, read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The bucket could not be opened or created.
    #[error("opening checkpoint bucket {bucket}")]
    Open {
        /// The bucket.
        bucket: String,
        /// Why.
        #[source]
        source: podstream_bus::StreamError,
    },
    /// Another ingest claimed the checkpoint, or this one's lease ran out: it may write
    /// nothing more.
    #[error(transparent)]
    Deposed(#[from] Deposed),
    /// The `leader` key could not be set.
    #[error("claiming the checkpoint")]
    Claim(#[source] kv::UpdateError),
    /// The `leader` key could not be read.
    #[error("reading the checkpoint's leader")]
    Leader(#[source] kv::EntryError),
    /// Reading the checkpoint back failed.
    #[error("reading {what}")]
    Read {
        /// What was read.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Reading the checkpoint back took longer than it may.
    #[error("reading the checkpoint: timed out")]
    ReadTimedOut,
    /// A key could not be read.
    #[error("reading {key}")]
    Entry {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: kv::EntryError,
    },
    /// A key could not be written.
    #[error("writing {key}")]
    Write {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: kv::UpdateError,
    },
    /// A stale key could not be purged.
    #[error("purging {key}")]
    Purge {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: kv::PurgeError,
    },
    /// Keys were at newer revisions than expected, by a write of this ingest whose ack was
    /// lost: they are rewritten next time.
    #[error("checkpoint keys moved by a write of ours; rewritten next time")]
    MovedByUs,
    /// The background writer panicked.
    #[error("checkpoint writer panicked")]
    Panicked(#[source] tokio::task::JoinError),
}

impl CheckpointError {
    /// `source` as [`CheckpointError::Read`] of `what`.
    fn read(
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        CheckpointError::Read {
            what,
            source: source.into(),
        }
    }
}

/// What a restarted ingest starts from.
#[derive(Debug, Default)]
pub struct Restored {
    /// The last published event of every live pod.
    pub pods: Vec<PodEvent>,
    /// The newest resourceVersion published, if any.
    pub resume: Option<u64>,
    /// The last published event of every live Spark object.
    pub spark: Vec<SparkEvent>,
}

/// The checkpoint bucket: the acked state by shard, and which shards changed since the last
/// write.
pub struct Checkpoint {
    kv: kv::Store,
    stream: String,
    js: jetstream::Context,
    /// Per shard, uid → last acked event, encoded.
    shards: Vec<HashMap<String, Bytes, FastHash>>,
    dirty: Vec<bool>,
    dirty_list: Vec<usize>,
    /// Per shard, how many of its parts held pods after the last write (1 at least).
    live_parts: Vec<usize>,
    /// The most bytes one part's value may take.
    part_limit: usize,
    /// Keys of an older layout found at load, purged once the shards are written.
    stale: Vec<String>,
    resume: Option<u64>,
    resume_dirty: bool,
    /// Spark objects' uid → last acked event, encoded.
    spark: HashMap<String, Bytes, FastHash>,
    spark_dirty: bool,
    /// The KV revision of each shard key, and of the resume key, as this writer left them.
    revisions: Revisions,
    /// The `leader` key's value for this writer, once it claimed the checkpoint.
    claim: Option<Bytes>,
    fence: Fence,
    interval: Duration,
    last_write: Option<Instant>,
    in_flight: Option<tokio::task::JoinHandle<(Written, Result<(), WriteFailed>)>>,
}

/// The KV revisions a writer expects to find.
#[derive(Debug, Clone)]
struct Revisions {
    /// Per shard, the revision of each of its parts' keys written so far (the first always).
    shards: Vec<Vec<u64>>,
    resume: u64,
    leader: u64,
    spark: u64,
}

impl Revisions {
    fn set_shard(&mut self, shard: usize, part: usize, revision: u64) {
        let parts = &mut self.shards[shard];
        if parts.len() <= part {
            parts.resize(part + 1, ABSENT);
        }
        parts[part] = revision;
    }
}

impl Default for Revisions {
    fn default() -> Self {
        Revisions {
            shards: vec![vec![ABSENT]; SHARDS],
            resume: ABSENT,
            leader: ABSENT,
            spark: ABSENT,
        }
    }
}

impl Checkpoint {
    /// Opens (or creates) the bucket; background writes start at most once per `interval`,
    /// and only while `fence` holds.
    pub async fn open(
        js: &jetstream::Context,
        bucket: &str,
        replicas: usize,
        interval: Duration,
        fence: Fence,
    ) -> Result<Checkpoint, CheckpointError> {
        let config = kv::Config {
            bucket: bucket.to_owned(),
            description: "podstream ingest checkpoint: last published event per pod".into(),
            history: 1,
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        let kv = podstream_bus::streams::bucket(js, config)
            .await
            .map_err(|source| CheckpointError::Open {
                bucket: bucket.to_owned(),
                source,
            })?;
        Ok(Checkpoint {
            kv,
            stream: podstream_bus::streams::bucket_stream(bucket),
            js: js.clone(),
            shards: vec![HashMap::default(); SHARDS],
            dirty: vec![false; SHARDS],
            dirty_list: Vec::new(),
            live_parts: vec![1; SHARDS],
            part_limit: podstream_bus::dead::body_limit(js.client().server_info().max_payload)
                .max(MIN_PART_LIMIT),
            stale: Vec::new(),
            resume: None,
            resume_dirty: false,
            spark: HashMap::default(),
            spark_dirty: false,
            revisions: Revisions::default(),
            claim: None,
            fence,
            interval,
            last_write: None,
            in_flight: None,
        })
    }

    /// The same checkpoint with parts of at most `bytes` (the server's `max_payload` less
    /// room for headers by default): for a test to split shards without a million pods.
    pub fn with_part_limit(mut self, bytes: usize) -> Checkpoint {
        self.part_limit = bytes.max(1);
        self
    }

    /// Claims the checkpoint for `identity`: the `leader` key gets the next term, set at the
    /// revision just read, so of two ingests claiming at once one is [`Deposed`]. Every later
    /// write proves the claim still holds. Returns the term.
    pub async fn claim(&mut self, identity: &str) -> Result<u64, CheckpointError> {
        let current = read_leader(&self.kv).await?;
        let (term, revision) = match &current {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let term = std::str::from_utf8(&entry.value)
                    .ok()
                    .and_then(|v| v.split(' ').next())
                    .and_then(|t| t.parse::<u64>().ok())
                    .unwrap_or(0);
                (term + 1, entry.revision)
            }
            Some(entry) => (1, entry.revision),
            None => (1, ABSENT),
        };
        let value = Bytes::from(format!("{term} {identity}"));
        match self.kv.update(LEADER_KEY, value.clone(), revision).await {
            Ok(revision) => {
                self.revisions.leader = revision;
                self.claim = Some(value);
                tracing::info!(term, %identity, "checkpoint claimed");
                Ok(term)
            }
            Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(Deposed("another ingest claimed the checkpoint at the same time".into()).into())
            }
            Err(error) => Err(CheckpointError::Claim(error)),
        }
    }

    /// Reads everything back. An entry that does not decode is skipped with a warning: its
    /// pods then count as unknown, which at worst republishes them.
    pub async fn load(&mut self) -> Result<Restored, CheckpointError> {
        let mut stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| CheckpointError::read("the checkpoint bucket", e))?;
        let messages = stream
            .info()
            .await
            .map_err(|e| CheckpointError::read("the checkpoint bucket", e))?
            .state
            .messages;
        let mut restored = Restored::default();
        if messages == 0 {
            return Ok(restored);
        }
        let mut sharded: HashMap<String, (PodEvent, Bytes)> = HashMap::new();
        let mut watch = self
            .kv
            .watch_with_history(">")
            .await
            .map_err(|e| CheckpointError::read("the checkpoint", e))?;
        while let Some(entry) = tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .map_err(|_| CheckpointError::ReadTimedOut)?
        {
            let entry = entry.map_err(|e| CheckpointError::read("the checkpoint", e))?;
            let live = entry.operation == kv::Operation::Put;
            if entry.key == RESUME_KEY {
                self.revisions.resume = entry.revision;
                restored.resume = std::str::from_utf8(&entry.value)
                    .ok()
                    .and_then(|v| v.parse().ok());
            } else if entry.key == SPARK_KEY {
                self.revisions.spark = entry.revision;
                if live {
                    self.load_spark(&entry.value, &mut restored);
                }
            } else if let Some(rest) = entry.key.strip_prefix(SHARD_PREFIX) {
                match shard_and_part(rest) {
                    Some((shard, part)) => {
                        self.revisions.set_shard(shard, part, entry.revision);
                        if live && !entry.value.is_empty() {
                            let parts = &mut self.live_parts[shard];
                            *parts = (*parts).max(part + 1);
                        }
                    }
                    None if live => self.stale.push(entry.key.clone()),
                    None => {}
                }
                if live {
                    match decode_shard(&entry.value) {
                        Ok(events) => sharded.extend(events.into_iter().filter_map(keyed)),
                        Err(error) => {
                            tracing::warn!(key = %entry.key, %error, "checkpoint shard unreadable; its pods count as unknown")
                        }
                    }
                }
            }
            if entry.delta == 0 {
                break;
            }
        }
        let migrate = !self.stale.is_empty();
        for (uid, (event, encoded)) in sharded {
            let shard = shard_of(&uid);
            self.shards[shard].insert(uid, encoded);
            if migrate {
                self.mark(shard);
            }
            restored.pods.push(event);
        }
        self.resume = restored.resume;
        Ok(restored)
    }

    /// The Spark objects' events of the `spark` key; unreadable ones count as unknown.
    fn load_spark(&mut self, value: &[u8], restored: &mut Restored) {
        let events = match decode_shard(value) {
            Ok(events) => events,
            Err(error) => {
                tracing::warn!(%error, "checkpoint's Spark objects unreadable; they count as unknown");
                return;
            }
        };
        for encoded in events {
            match SparkEvent::decode(encoded.as_ref()) {
                Ok(event) => {
                    self.spark
                        .insert(crate::spark::identity(&event).2.to_owned(), encoded);
                    restored.spark.push(event);
                }
                Err(error) => {
                    tracing::warn!(%error, "checkpoint entry unreadable; its Spark object counts as unknown")
                }
            }
        }
    }

    /// Notes an acked Spark object's event: its last event, or its end.
    pub fn record_spark(&mut self, message: &SparkOutgoing) {
        let uid = message.uid();
        if message.event.r#type() == EventType::Deleted {
            self.spark.remove(uid);
        } else {
            self.spark.insert(uid.to_owned(), message.payload.clone());
        }
        self.spark_dirty = true;
    }

    fn mark(&mut self, shard: usize) {
        if !self.dirty[shard] {
            self.dirty[shard] = true;
            self.dirty_list.push(shard);
        }
    }

    /// Notes an acked message: its pod's last event, or the pod's end.
    pub fn record(&mut self, message: &Outgoing) {
        if message.role != Role::Event {
            return;
        }
        let uid = uid(&message.event);
        let shard = shard_of(uid);
        let pods = &mut self.shards[shard];
        if message.event.r#type() == EventType::Deleted {
            pods.remove(uid);
        } else if let Some(last) = pods.get_mut(uid) {
            *last = message.payload.clone();
        } else {
            pods.insert(uid.to_owned(), message.payload.clone());
        }
        self.mark(shard);
        if !message.event.synthesized
            && let Ok(rv) = message.event.resource_version.parse::<u64>()
            && self.resume.is_none_or(|r| rv > r)
        {
            self.resume = Some(rv);
            self.resume_dirty = true;
        }
    }

    /// Writes what changed since the last write, and waits for it (and for any write still
    /// running in the background).
    pub async fn flush(&mut self) -> Result<(), CheckpointError> {
        if let Some(running) = self.in_flight.take() {
            let done = running.await.map_err(CheckpointError::Panicked)?;
            self.settle(done)?;
        }
        let write = self.take_dirty();
        self.last_write = Some(Instant::now());
        let done = write_out(self.kv.clone(), write).await;
        self.settle(done)
    }

    /// The result of a write: the revisions it left, and what a failed one was to write is
    /// marked for the next.
    fn settle(
        &mut self,
        (written, done): (Written, Result<(), WriteFailed>),
    ) -> Result<(), CheckpointError> {
        for (shard, part, revision) in written.shards {
            self.revisions.set_shard(shard, part, revision);
        }
        for (shard, parts) in written.live_parts {
            self.live_parts[shard] = parts;
        }
        if let Some(revision) = written.resume {
            self.revisions.resume = revision;
        }
        if let Some(revision) = written.leader {
            self.revisions.leader = revision;
        }
        if let Some(revision) = written.spark {
            self.revisions.spark = revision;
        }
        let Err(failed) = done else { return Ok(()) };
        for shard in failed.shards {
            self.mark(shard);
        }
        self.stale.extend(failed.stale);
        self.resume_dirty |= failed.resume;
        self.spark_dirty |= failed.spark;
        Err(failed.error)
    }

    /// Starts writing what changed since the last write without waiting, so the watch loop
    /// never stalls on the bucket; at most once per interval. While a write runs, changes
    /// keep collecting for the next one (writes never overlap, so a key's older value cannot
    /// land after its newer one). Returns the error of the previous background write, if it
    /// failed.
    pub fn flush_in_background(&mut self) -> Option<CheckpointError> {
        let mut failed = None;
        if let Some(mut running) = self.in_flight.take() {
            // A finished task can still poll as pending (Tokio's cooperative budget): then it
            // is kept, never dropped with the revisions it wrote.
            match futures::FutureExt::now_or_never(&mut running) {
                None => {
                    self.in_flight = Some(running);
                    return None;
                }
                Some(Ok(done)) => failed = self.settle(done).err(),
                Some(Err(panicked)) => failed = Some(CheckpointError::Panicked(panicked)),
            }
        }
        if self
            .last_write
            .is_some_and(|last| last.elapsed() < self.interval)
        {
            return failed;
        }
        let write = self.take_dirty();
        if !write.is_empty() {
            self.last_write = Some(Instant::now());
            self.in_flight = Some(tokio::spawn(write_out(self.kv.clone(), write)));
        }
        failed
    }

    fn take_dirty(&mut self) -> Write {
        let mut shards = Vec::with_capacity(self.dirty_list.len());
        for shard in self.dirty_list.drain(..) {
            self.dirty[shard] = false;
            shards.push(ShardWrite {
                shard,
                pods: self.shards[shard].values().cloned().collect(),
                revisions: self.revisions.shards[shard].clone(),
                live_parts: self.live_parts[shard],
            });
        }
        let resume = match (self.resume_dirty, self.resume) {
            (true, Some(rv)) => Some((rv, self.revisions.resume)),
            _ => None,
        };
        self.resume_dirty = false;
        let spark = std::mem::take(&mut self.spark_dirty)
            .then(|| (self.spark.values().cloned().collect(), self.revisions.spark));
        Write {
            shards,
            part_limit: self.part_limit,
            spark,
            // Purged after the shards that replace them are written.
            stale: std::mem::take(&mut self.stale),
            resume,
            claim: self
                .claim
                .clone()
                .map(|value| (value, self.revisions.leader)),
            fence: self.fence.clone(),
        }
    }
}

/// An encoded event by its pod's uid, decoded; an unreadable one is skipped with a warning
/// (the pod then counts as unknown, which at worst republishes it).
fn keyed(encoded: Bytes) -> Option<(String, (PodEvent, Bytes))> {
    match PodEvent::decode(encoded.as_ref()) {
        Ok(event) => Some((uid(&event).to_owned(), (event, encoded))),
        Err(error) => {
            tracing::warn!(%error, "checkpoint entry unreadable; its pod counts as unknown");
            None
        }
    }
}

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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, kv};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use podstream_proto::PodEvent;
use podstream_proto::v1::{EventType, SparkEvent};
use prost::Message as _;

use crate::known::{FastHash, Outgoing, Role, uid};
use crate::leadership::{Deposed, Fence};
use crate::spark::SparkOutgoing;

/// Key holding the last published resourceVersion.
const RESUME_KEY: &str = "resume";
/// Key holding the term and identity of the ingest that writes the checkpoint.
const LEADER_KEY: &str = "leader";
/// Key holding the last published event of every Spark object (`--spark`), in one value:
/// Spark objects are few.
const SPARK_KEY: &str = "spark";
/// The KV revision of a key that does not exist: a compare-and-set expecting no value.
const ABSENT: u64 = 0;
/// Prefix of shard keys: `pods.<shard>`, four digits.
const SHARD_PREFIX: &str = "pods.";
/// Shards of the pods' entries. Changing it leaves keys past the new count to be purged
/// after the first write.
pub const SHARDS: usize = 1024;
/// Writes in flight at once when flushing.
const FLUSH_CONCURRENCY: usize = 64;
/// The smallest part the server's `max_payload` can leave (a server configured tiny).
const MIN_PART_LIMIT: usize = 1024;

/// The shard of a pod: FNV-1a of its uid, stable across builds and versions.
pub fn shard_of(uid: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in uid.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % SHARDS as u64) as usize
}

/// The key of part `part` of a shard: `pods.0007` for the first, `pods.0007.1` after it.
fn shard_key(shard: usize, part: usize) -> String {
    if part == 0 {
        format!("{SHARD_PREFIX}{shard:04}")
    } else {
        format!("{SHARD_PREFIX}{shard:04}.{part}")
    }
}

/// The shard and part a key after [`SHARD_PREFIX`] names (`0007`, `0007.1`), if it names one.
fn shard_and_part(rest: &str) -> Option<(usize, usize)> {
    let (shard, part) = match rest.split_once('.') {
        Some((shard, part)) => (shard, part.parse().ok().filter(|p| *p > 0)?),
        None => (rest, 0),
    };
    let shard = shard.parse().ok().filter(|s| *s < SHARDS)?;
    Some((shard, part))
}

/// A shard's events as the values of its parts, each at most `limit` bytes (an event over
/// the limit alone in its part); at least one part, empty when the shard has no pods.
pub fn encode_parts(events: &[Bytes], limit: usize) -> Vec<Bytes> {
    let mut parts = Vec::new();
    let mut from = 0;
    let mut size = 0;
    for (at, event) in events.iter().enumerate() {
        let entry = prost::encoding::encoded_len_varint(event.len() as u64) + event.len();
        if at > from && size + entry > limit {
            parts.push(encode_shard(&events[from..at]));
            from = at;
            size = 0;
        }
        size += entry;
    }
    if from < events.len() || parts.is_empty() {
        parts.push(encode_shard(&events[from..]));
    }
    parts
}

/// A shard's value: each pod's last event, encoded, as a varint length and the bytes.
pub fn encode_shard<'a>(events: impl IntoIterator<Item = &'a Bytes>) -> Bytes {
    let mut out = BytesMut::new();
    for event in events {
        prost::encoding::encode_varint(event.len() as u64, &mut out);
        out.put_slice(event);
    }
    out.freeze()
}

/// A shard's value that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum ShardUnreadable {
    /// An entry's length is not a varint.
    #[error("an entry's length is unreadable: {0}")]
    Length(#[from] prost::DecodeError),
    /// An entry is longer than what is left.
    #[error("an entry of {len} bytes with {left} left")]
    CutShort {
        /// The entry's length.
        len: u64,
        /// The bytes left.
        left: usize,
    },
}

/// The encoded events of a shard's value, in order.
pub fn decode_shard(mut value: &[u8]) -> Result<Vec<Bytes>, ShardUnreadable> {
    let mut events = Vec::new();
    while value.has_remaining() {
        let len = prost::encoding::decode_varint(&mut value)?;
        let Some(entry) = usize::try_from(len).ok().and_then(|n| value.get(..n)) else {
            return Err(ShardUnreadable::CutShort {
                len,
                left: value.len(),
            });
        };
        events.push(Bytes::copy_from_slice(entry));
        value.advance(entry.len());
    }
    Ok(events)
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

/// The revisions a write left, key by key, whether or not all of it succeeded.
#[derive(Debug, Default)]
struct Written {
    /// (shard, part, revision).
    shards: Vec<(usize, usize, u64)>,
    /// Shards written whole: how many of their parts hold pods now.
    live_parts: Vec<(usize, usize)>,
    resume: Option<u64>,
    leader: Option<u64>,
    spark: Option<u64>,
}

/// A write that failed: the error, and what it was to write, to be written again.
struct WriteFailed {
    error: anyhow::Error,
    shards: Vec<usize>,
    stale: Vec<String>,
    resume: bool,
    spark: bool,
}

/// One write: shards to put (an empty value for a shard left without pods), stale keys to
/// purge, the resume revision, each at the KV revision expected.
#[derive(Default)]
struct Write {
    /// Each shard's pods (their events, shared, not copied), the expected revision of each
    /// of its parts' keys, and how many parts held pods: encoded only as it is written, so a
    /// write holds a few shard values at a time, not the whole checkpoint twice.
    shards: Vec<ShardWrite>,
    /// The most bytes one part's value may take.
    part_limit: usize,
    stale: Vec<String>,
    resume: Option<(u64, u64)>,
    /// The Spark objects' events and the expected revision of their key.
    spark: Option<(Vec<Bytes>, u64)>,
    /// The `leader` value and its expected revision: set first, proving the claim holds.
    claim: Option<(Bytes, u64)>,
    fence: Fence,
}

/// One shard of a [`Write`].
struct ShardWrite {
    shard: usize,
    pods: Vec<Bytes>,
    revisions: Vec<u64>,
    live_parts: usize,
}

impl Write {
    fn is_empty(&self) -> bool {
        self.shards.is_empty()
            && self.stale.is_empty()
            && self.resume.is_none()
            && self.spark.is_none()
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
    ) -> anyhow::Result<Checkpoint> {
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
            .with_context(|| format!("opening checkpoint bucket {bucket}"))?;
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
    pub async fn claim(&mut self, identity: &str) -> anyhow::Result<u64> {
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
            Err(error) => Err(anyhow::Error::new(error).context("claiming the checkpoint")),
        }
    }

    /// Reads everything back. An entry that does not decode is skipped with a warning: its
    /// pods then count as unknown, which at worst republishes them.
    pub async fn load(&mut self) -> anyhow::Result<Restored> {
        let mut stream = self
            .js
            .get_stream(&self.stream)
            .await
            .context("reading checkpoint bucket")?;
        let messages = stream
            .info()
            .await
            .context("reading checkpoint bucket")?
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
            .context("reading checkpoint")?;
        while let Some(entry) = tokio::time::timeout(Duration::from_secs(30), watch.next())
            .await
            .context("reading checkpoint: timed out")?
        {
            let entry = entry.context("reading checkpoint")?;
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
    pub async fn flush(&mut self) -> anyhow::Result<()> {
        if let Some(running) = self.in_flight.take() {
            let done = running.await.context("checkpoint writer panicked")?;
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
    ) -> anyhow::Result<()> {
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
    pub fn flush_in_background(&mut self) -> Option<anyhow::Error> {
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
                Some(Err(panicked)) => {
                    failed =
                        Some(anyhow::Error::new(panicked).context("checkpoint writer panicked"))
                }
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

/// A compare-and-set that did not happen.
enum Refused {
    /// The key is not at the revision expected: someone wrote it, or a write of ours whose
    /// ack was lost did.
    Moved,
    /// Anything else (NATS down, a timeout): retried with the next write.
    Failed(anyhow::Error),
}

/// Sets `key` to `value` if it is still at `revision`; the new revision.
async fn compare_and_set(
    kv: &kv::Store,
    key: &str,
    value: Bytes,
    revision: u64,
) -> Result<u64, Refused> {
    match kv.update(key, value, revision).await {
        Ok(revision) => Ok(revision),
        Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => Err(Refused::Moved),
        Err(error) => Err(Refused::Failed(
            anyhow::Error::new(error).context(format!("writing {key}")),
        )),
    }
}

/// How long a claim retries reading the `leader` key while its bucket cannot answer yet (a
/// replicated bucket just created, or electing a leader after a node died: "no responders").
const LEADER_READ_PATIENCE: Duration = Duration::from_secs(30);

/// The `leader` key, read again while the bucket does not answer, for up to
/// [`LEADER_READ_PATIENCE`]: an ingest started beside a JetStream cluster that is still
/// electing must wait for it, not exit.
async fn read_leader(kv: &kv::Store) -> anyhow::Result<Option<kv::Entry>> {
    let deadline = Instant::now() + LEADER_READ_PATIENCE;
    let mut backoff =
        podstream_bus::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        match kv.entry(LEADER_KEY).await {
            Ok(entry) => return Ok(entry),
            Err(error) if Instant::now() < deadline => {
                tracing::warn!(%error, retry_in_ms = backoff.delay().as_millis() as u64,
                    "the checkpoint bucket does not answer yet; reading its leader again");
                backoff.wait().await;
            }
            Err(error) => {
                return Err(anyhow::Error::new(error).context("reading the checkpoint's leader"));
            }
        }
    }
}

/// After a key moved under this writer: if the `leader` key still holds this writer's claim,
/// nobody else writes (the move was a write of ours whose ack was lost), and the keys'
/// current revisions are taken for the next write; otherwise this writer is [`Deposed`].
async fn still_ours(
    kv: &kv::Store,
    claim: Option<&Bytes>,
    moved: &[String],
) -> anyhow::Result<Vec<(String, u64)>> {
    let leader = kv
        .entry(LEADER_KEY)
        .await
        .context("reading the checkpoint's leader")?;
    let ours = matches!((&leader, claim), (Some(entry), Some(claim)) if entry.value == *claim);
    if !ours {
        let by = leader
            .map(|entry| String::from_utf8_lossy(&entry.value).into_owned())
            .unwrap_or_default();
        return Err(Deposed(format!("another ingest claimed the checkpoint ({by})")).into());
    }
    let mut current = Vec::with_capacity(moved.len());
    for key in moved {
        let revision = if key == LEADER_KEY {
            leader.as_ref().map_or(ABSENT, |entry| entry.revision)
        } else {
            kv.entry(key.as_str())
                .await
                .with_context(|| format!("reading {key}"))?
                .map_or(ABSENT, |entry| entry.revision)
        };
        current.push((key.clone(), revision));
    }
    Ok(current)
}

/// The compare-and-sets of one phase of a write that did not happen.
#[derive(Default)]
struct Refusals {
    moved: Vec<String>,
    failed: Option<anyhow::Error>,
}

impl Refusals {
    fn note(&mut self, key: String, refused: Refused) {
        match refused {
            Refused::Moved => self.moved.push(key),
            Refused::Failed(error) => {
                self.failed.get_or_insert(error);
            }
        }
    }

    fn is_clear(&self) -> bool {
        self.moved.is_empty() && self.failed.is_none()
    }

    /// The error to report: [`Deposed`] when a moved key was another writer's; otherwise the
    /// moved keys' current revisions go into `written` (to be rewritten at them next time).
    async fn settle(
        self,
        kv: &kv::Store,
        claim: Option<&Bytes>,
        written: &mut Written,
    ) -> anyhow::Error {
        if !self.moved.is_empty() {
            match still_ours(kv, claim, &self.moved).await {
                Ok(current) => {
                    tracing::warn!(
                        keys = current.len(),
                        "checkpoint keys at newer revisions than expected (a lost ack); rewriting them"
                    );
                    for (key, revision) in current {
                        if key == LEADER_KEY {
                            written.leader = Some(revision);
                        } else if key == RESUME_KEY {
                            written.resume = Some(revision);
                        } else if key == SPARK_KEY {
                            written.spark = Some(revision);
                        } else if let Some((shard, part)) =
                            key.strip_prefix(SHARD_PREFIX).and_then(shard_and_part)
                        {
                            written.shards.push((shard, part, revision));
                        }
                    }
                }
                Err(error) => return error,
            }
        }
        self.failed.unwrap_or_else(|| {
            anyhow::anyhow!("checkpoint keys moved by a write of ours; rewritten next time")
        })
    }
}

/// Proves the claim (the `leader` key), writes the shards, then purges stale keys, then the
/// resume revision (only once the pods it covers are written); nothing once the fence closed.
async fn write_out(kv: kv::Store, write: Write) -> (Written, Result<(), WriteFailed>) {
    let kv = &kv;
    let Write {
        shards,
        part_limit,
        stale,
        resume,
        spark,
        claim,
        fence,
    } = write;
    let all_shards: Vec<usize> = shards.iter().map(|write| write.shard).collect();
    let failure = |error: anyhow::Error, stale: Vec<String>| WriteFailed {
        error,
        shards: all_shards.clone(),
        stale,
        resume: resume.is_some(),
        spark: spark.is_some(),
    };
    let mut written = Written::default();
    if let Err(deposed) = fence.check() {
        return (written, Err(failure(deposed.into(), stale)));
    }
    let claimed = claim.as_ref().map(|(value, _)| value.clone());
    let mut refusals = Refusals::default();
    if let Some((value, revision)) = claim {
        match compare_and_set(kv, LEADER_KEY, value, revision).await {
            Ok(revision) => written.leader = Some(revision),
            Err(refused) => refusals.note(LEADER_KEY.to_owned(), refused),
        }
    }
    if refusals.is_clear() {
        // Each shard's parts, and an empty value for each part that held pods before but is
        // no longer needed.
        let mut parts_of: HashMap<usize, (usize, usize)> = HashMap::new();
        let mut puts: Vec<(usize, usize, Bytes, u64)> = Vec::new();
        for write in shards {
            let mut parts = encode_parts(&write.pods, part_limit);
            let needed = parts.len();
            parts.resize(needed.max(write.live_parts), Bytes::new());
            parts_of.insert(write.shard, (needed, write.live_parts));
            for (part, value) in parts.into_iter().enumerate() {
                let revision = write.revisions.get(part).copied().unwrap_or(ABSENT);
                puts.push((write.shard, part, value, revision));
            }
        }
        let results: Vec<(usize, usize, Result<u64, Refused>)> = futures::stream::iter(puts)
            .map(|(shard, part, value, revision)| async move {
                let key = shard_key(shard, part);
                (
                    shard,
                    part,
                    compare_and_set(kv, &key, value, revision).await,
                )
            })
            .buffer_unordered(FLUSH_CONCURRENCY)
            .collect()
            .await;
        let mut refused_shards = std::collections::HashSet::new();
        for (shard, part, result) in results {
            match result {
                Ok(revision) => written.shards.push((shard, part, revision)),
                Err(refused) => {
                    refused_shards.insert(shard);
                    refusals.note(shard_key(shard, part), refused);
                }
            }
        }
        // A shard written only in part may still hold pods in any part it had or wrote.
        written.live_parts = parts_of
            .into_iter()
            .map(|(shard, (needed, before))| {
                let live = if refused_shards.contains(&shard) {
                    needed.max(before)
                } else {
                    needed
                };
                (shard, live)
            })
            .collect();
        if let Some((events, revision)) = &spark {
            match compare_and_set(kv, SPARK_KEY, encode_shard(events), *revision).await {
                Ok(revision) => written.spark = Some(revision),
                Err(refused) => refusals.note(SPARK_KEY.to_owned(), refused),
            }
        }
    }
    if !refusals.is_clear() {
        let error = refusals.settle(kv, claimed.as_ref(), &mut written).await;
        return (written, Err(failure(error, stale)));
    }
    for (index, key) in stale.iter().enumerate() {
        if let Err(error) = kv.purge(key).await {
            let error = anyhow::Error::new(error).context(format!("purging {key}"));
            return (written, Err(failure(error, stale[index..].to_vec())));
        }
    }
    if let Some((rv, revision)) = resume {
        let value = Bytes::from(rv.to_string());
        match compare_and_set(kv, RESUME_KEY, value, revision).await {
            Ok(revision) => written.resume = Some(revision),
            Err(refused) => {
                refusals.note(RESUME_KEY.to_owned(), refused);
                let error = refusals.settle(kv, claimed.as_ref(), &mut written).await;
                return (written, Err(failure(error, Vec::new())));
            }
        }
    }
    (written, Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_value_reads_back_as_written_and_a_cut_one_is_refused() {
        let events = [
            Bytes::from_static(b"first"),
            Bytes::new(),
            Bytes::from(vec![7u8; 300]),
        ];
        let value = encode_shard(&events);
        assert_eq!(decode_shard(&value).unwrap(), events);
        assert_eq!(decode_shard(&[]).unwrap(), Vec::<Bytes>::new());
        let cut = &value[..value.len() - 1];
        assert!(matches!(
            decode_shard(cut),
            Err(ShardUnreadable::CutShort {
                len: 300,
                left: 299
            })
        ));
        assert!(matches!(
            decode_shard(&[0xff]),
            Err(ShardUnreadable::Length(_))
        ));
    }

    /// Parts hold the events in order, each part within the limit but for an event over it
    /// alone, and read back to the events; no events still make one (empty) part.
    #[test]
    fn parts_keep_within_the_limit_and_read_back_in_order() {
        let event = |n: usize| Bytes::from(vec![b'e'; n]);
        // (event sizes, limit, events per part); an entry is its length's varint plus it.
        let table: &[(&[usize], usize, &[usize])] = &[
            (&[], 100, &[0]),
            (&[10, 10, 10], 100, &[3]),
            (&[10, 10, 10], 22, &[2, 1]),
            (&[10, 10, 10], 11, &[1, 1, 1]),
            (&[50, 200, 10, 10], 100, &[1, 1, 2]),
            (&[200], 100, &[1]),
        ];
        for (sizes, limit, expected) in table {
            let events: Vec<Bytes> = sizes.iter().map(|&n| event(n)).collect();
            let parts = encode_parts(&events, *limit);
            let counts: Vec<usize> = parts
                .iter()
                .map(|part| decode_shard(part).unwrap().len())
                .collect();
            assert_eq!(&counts, expected, "{sizes:?} in parts of {limit}");
            for part in &parts {
                let decoded = decode_shard(part).unwrap();
                assert!(part.len() <= *limit || decoded.len() == 1, "{sizes:?}");
            }
            let read: Vec<Bytes> = parts
                .iter()
                .flat_map(|part| decode_shard(part).unwrap())
                .collect();
            assert_eq!(read, events);
        }
    }

    /// The keys of a shard's parts, and what is not one (left as stale by a load).
    #[test]
    fn shard_keys_name_their_shard_and_part() {
        assert_eq!(shard_key(7, 0), "pods.0007");
        assert_eq!(shard_key(7, 2), "pods.0007.2");
        for (rest, named) in [
            ("0007", Some((7, 0))),
            ("0007.2", Some((7, 2))),
            ("1023.11", Some((1023, 11))),
            ("0007.0", None),
            ("1024", None),
            ("0007.x", None),
            ("abc", None),
        ] {
            assert_eq!(shard_and_part(rest), named, "{rest}");
        }
    }

    /// A pod's shard must not change between versions: its entry would then live in two keys.
    #[test]
    fn the_shard_of_a_uid_is_pinned() {
        // FNV-1a's published vector: "a" hashes to 0xaf63dc4c8601ec8c.
        assert_eq!(
            shard_of("a"),
            (0xaf63_dc4c_8601_ec8c_u64 % SHARDS as u64) as usize
        );
        assert_eq!(shard_of("u-1"), 578);
        assert_eq!(shard_of("0b6e5c3a-6f1e-4c8e-9a55-1d2e3f405162"), 561);
        let spread: std::collections::HashSet<usize> =
            (0..10_000).map(|i| shard_of(&format!("uid-{i}"))).collect();
        assert!(
            spread.len() > SHARDS * 9 / 10,
            "10k uids use most shards: {}",
            spread.len()
        );
    }
}

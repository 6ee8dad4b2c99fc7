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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, kv};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use podstream_proto::PodEvent;
use podstream_proto::v1::EventType;
use prost::Message as _;

use crate::known::{FastHash, Outgoing, Role, uid};

/// Key holding the last published resourceVersion.
const RESUME_KEY: &str = "resume";
/// Prefix of shard keys: `pods.<shard>`, four digits.
const SHARD_PREFIX: &str = "pods.";
/// Shards of the pods' entries. Changing it leaves keys past the new count to be purged
/// after the first write.
pub const SHARDS: usize = 1024;
/// Writes in flight at once when flushing.
const FLUSH_CONCURRENCY: usize = 64;

/// The shard of a pod: FNV-1a of its uid, stable across builds and versions.
pub fn shard_of(uid: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in uid.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % SHARDS as u64) as usize
}

fn shard_key(shard: usize) -> String {
    format!("{SHARD_PREFIX}{shard:04}")
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
    /// Keys of an older layout found at load, purged once the shards are written.
    stale: Vec<String>,
    resume: Option<u64>,
    resume_dirty: bool,
    interval: Duration,
    last_write: Option<Instant>,
    in_flight: Option<tokio::task::JoinHandle<Result<(), WriteFailed>>>,
}

/// A write that failed: the error, and what it was to write, to be written again.
struct WriteFailed {
    error: anyhow::Error,
    shards: Vec<usize>,
    stale: Vec<String>,
    resume: bool,
}

/// One write: shards to put (or purge, when empty), stale keys to purge, the resume revision.
#[derive(Default)]
struct Write {
    /// Each shard's pods (their events, shared, not copied): encoded only as it is written,
    /// so a write holds a few shard values at a time, not the whole checkpoint twice.
    shards: Vec<(usize, Vec<Bytes>)>,
    stale: Vec<String>,
    resume: Option<u64>,
}

impl Write {
    fn is_empty(&self) -> bool {
        self.shards.is_empty() && self.stale.is_empty() && self.resume.is_none()
    }
}

impl Checkpoint {
    /// Opens (or creates) the bucket; background writes start at most once per `interval`.
    pub async fn open(
        js: &jetstream::Context,
        bucket: &str,
        replicas: usize,
        interval: Duration,
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
            stream: format!("KV_{bucket}"),
            js: js.clone(),
            shards: vec![HashMap::default(); SHARDS],
            dirty: vec![false; SHARDS],
            dirty_list: Vec::new(),
            stale: Vec::new(),
            resume: None,
            resume_dirty: false,
            interval,
            last_write: None,
            in_flight: None,
        })
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
                restored.resume = std::str::from_utf8(&entry.value)
                    .ok()
                    .and_then(|v| v.parse().ok());
            } else if let Some(shard) = entry.key.strip_prefix(SHARD_PREFIX)
                && live
            {
                if !shard.parse::<usize>().is_ok_and(|s| s < SHARDS) {
                    self.stale.push(entry.key.clone());
                }
                match decode_shard(&entry.value) {
                    Ok(events) => sharded.extend(events.into_iter().filter_map(keyed)),
                    Err(error) => {
                        tracing::warn!(key = %entry.key, %error, "checkpoint shard unreadable; its pods count as unknown")
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

    /// The result of a write; what a failed one was to write is marked for the next.
    fn settle(&mut self, done: Result<(), WriteFailed>) -> anyhow::Result<()> {
        let Err(failed) = done else { return Ok(()) };
        for shard in failed.shards {
            self.mark(shard);
        }
        self.stale.extend(failed.stale);
        self.resume_dirty |= failed.resume;
        Err(failed.error)
    }

    /// Starts writing what changed since the last write without waiting, so the watch loop
    /// never stalls on the bucket; at most once per interval. While a write runs, changes
    /// keep collecting for the next one (writes never overlap, so a key's older value cannot
    /// land after its newer one). Returns the error of the previous background write, if it
    /// failed.
    pub fn flush_in_background(&mut self) -> Option<anyhow::Error> {
        let mut failed = None;
        if let Some(running) = self.in_flight.take() {
            if !running.is_finished() {
                self.in_flight = Some(running);
                return None;
            }
            if let Some(Ok(done)) = futures::FutureExt::now_or_never(running) {
                failed = self.settle(done).err();
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
            shards.push((shard, self.shards[shard].values().cloned().collect()));
        }
        let resume = if self.resume_dirty { self.resume } else { None };
        self.resume_dirty = false;
        Write {
            shards,
            // Purged after the shards that replace them are written.
            stale: std::mem::take(&mut self.stale),
            resume,
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

/// Writes the shards, then purges stale keys, then the resume revision (only once the pods
/// it covers are written).
async fn write_out(kv: kv::Store, write: Write) -> Result<(), WriteFailed> {
    let kv = &kv;
    let resume = write.resume;
    let written: Vec<usize> = write.shards.iter().map(|(shard, _)| *shard).collect();
    let failure = |error: anyhow::Error, stale: Vec<String>| WriteFailed {
        error,
        shards: written.clone(),
        stale,
        resume: resume.is_some(),
    };
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(write.shards)
        .map(|(shard, pods)| async move {
            let key = shard_key(shard);
            if pods.is_empty() {
                kv.purge(&key)
                    .await
                    .with_context(|| format!("purging {key}"))
            } else {
                kv.put(&key, encode_shard(&pods))
                    .await
                    .map(|_| ())
                    .with_context(|| format!("writing {key}"))
            }
        })
        .buffer_unordered(FLUSH_CONCURRENCY)
        .collect()
        .await;
    if let Some(Err(error)) = results.into_iter().find(Result::is_err) {
        return Err(failure(error, write.stale));
    }
    for (index, key) in write.stale.iter().enumerate() {
        if let Err(error) = kv.purge(key).await {
            let left = write.stale[index..].to_vec();
            return Err(failure(
                anyhow::Error::new(error).context(format!("purging {key}")),
                left,
            ));
        }
    }
    if let Some(rv) = resume
        && let Err(error) = kv.put(RESUME_KEY, Bytes::from(rv.to_string())).await
    {
        return Err(failure(
            anyhow::Error::new(error).context("writing the resume revision"),
            Vec::new(),
        ));
    }
    Ok(())
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

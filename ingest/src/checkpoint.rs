//! The ingest's checkpoint in a JetStream KV bucket: per pod the last published `PodEvent`
//! (its owner and the facts the rules read; never the `Pod`), and the last published
//! resourceVersion. Written only for acked events, so it never claims more than was published.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::StreamExt;
use podstream_proto::PodEvent;
use podstream_proto::v1::EventType;
use prost::Message as _;

use crate::known::{Outgoing, Role, uid};

/// Key holding the last published resourceVersion.
const RESUME_KEY: &str = "resume";
/// Prefix of per-pod keys: `pod.<uid>`.
const POD_PREFIX: &str = "pod.";
/// Writes in flight at once when flushing.
const FLUSH_CONCURRENCY: usize = 256;

/// What a restarted ingest starts from.
#[derive(Debug, Default)]
pub struct Restored {
    /// The last published event of every live pod.
    pub pods: Vec<PodEvent>,
    /// The newest resourceVersion published, if any.
    pub resume: Option<u64>,
}

/// The checkpoint bucket, with changes collected since the last flush.
pub struct Checkpoint {
    kv: kv::Store,
    stream: String,
    js: jetstream::Context,
    dirty: HashMap<String, Option<Bytes>>,
    resume: Option<u64>,
    resume_dirty: bool,
    in_flight: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Checkpoint {
    /// Opens (or creates) the bucket.
    pub async fn open(
        js: &jetstream::Context,
        bucket: &str,
        replicas: usize,
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
            dirty: HashMap::new(),
            resume: None,
            resume_dirty: false,
            in_flight: None,
        })
    }

    /// Reads everything back. A value that does not decode is skipped with a warning: the
    /// pod is then treated as unknown, which at worst republishes it.
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
        let mut pods: HashMap<String, PodEvent> = HashMap::new();
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
            } else if let Some(uid) = entry.key.strip_prefix(POD_PREFIX) {
                if !live {
                    pods.remove(uid);
                } else {
                    match PodEvent::decode(entry.value.as_ref()) {
                        Ok(event) => {
                            pods.insert(uid.to_owned(), event);
                        }
                        Err(error) => {
                            tracing::warn!(uid, %error, "checkpoint entry unreadable; the pod counts as unknown")
                        }
                    }
                }
            }
            if entry.delta == 0 {
                break;
            }
        }
        self.resume = restored.resume;
        restored.pods = pods.into_values().collect();
        Ok(restored)
    }

    /// Notes an acked message: its pod's last event, or the pod's end.
    pub fn record(&mut self, message: &Outgoing) {
        if message.role != Role::Event {
            return;
        }
        let key = format!("{POD_PREFIX}{}", uid(&message.event));
        let value = (message.event.r#type() != EventType::Deleted)
            .then(|| Bytes::from(message.event.encode_to_vec()));
        self.dirty.insert(key, value);
        if !message.event.synthesized
            && let Ok(rv) = message.event.resource_version.parse::<u64>()
            && self.resume.is_none_or(|r| rv > r)
        {
            self.resume = Some(rv);
            self.resume_dirty = true;
        }
    }

    /// Changes not yet written.
    pub fn pending(&self) -> usize {
        self.dirty.len() + usize::from(self.resume_dirty)
    }

    /// Writes what changed since the last flush, and waits for it (and for any write still
    /// running in the background).
    pub async fn flush(&mut self) -> anyhow::Result<()> {
        if let Some(running) = self.in_flight.take() {
            running.await.context("checkpoint writer panicked")??;
        }
        let (writes, resume) = self.take_dirty();
        write(self.kv.clone(), writes, resume).await
    }

    /// Starts writing what changed since the last flush without waiting, so the watch loop
    /// never stalls on the bucket. While a write runs, changes keep collecting for the next
    /// one (writes never overlap, so a key's older value cannot land after its newer one).
    /// Returns the error of the previous background write, if it failed.
    pub fn flush_in_background(&mut self) -> Option<anyhow::Error> {
        let mut failed = None;
        if let Some(running) = self.in_flight.take() {
            if !running.is_finished() {
                self.in_flight = Some(running);
                return None;
            }
            if let Some(Ok(Err(error))) = futures::FutureExt::now_or_never(running) {
                failed = Some(error);
            }
        }
        let (writes, resume) = self.take_dirty();
        if !writes.is_empty() || resume.is_some() {
            self.in_flight = Some(tokio::spawn(write(self.kv.clone(), writes, resume)));
        }
        failed
    }

    fn take_dirty(&mut self) -> (Vec<(String, Option<Bytes>)>, Option<u64>) {
        let writes = self.dirty.drain().collect();
        let resume = if self.resume_dirty { self.resume } else { None };
        self.resume_dirty = false;
        (writes, resume)
    }
}

/// Writes pods' entries, then the resume revision (only once the pods it covers are written).
async fn write(
    kv: kv::Store,
    writes: Vec<(String, Option<Bytes>)>,
    resume: Option<u64>,
) -> anyhow::Result<()> {
    let kv = &kv;
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(writes)
        .map(|(key, value)| async move {
            match value {
                Some(value) => kv
                    .put(&key, value)
                    .await
                    .map(|_| ())
                    .with_context(|| format!("writing {key}")),
                None => kv
                    .purge(&key)
                    .await
                    .with_context(|| format!("purging {key}")),
            }
        })
        .buffer_unordered(FLUSH_CONCURRENCY)
        .collect()
        .await;
    for result in results {
        result?;
    }
    if let Some(rv) = resume {
        kv.put(RESUME_KEY, Bytes::from(rv.to_string()))
            .await
            .context("writing the resume revision")?;
    }
    Ok(())
}

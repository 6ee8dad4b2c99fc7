//! One write of the checkpoint: the claim proven on the `leader` key, each changed shard's
//! parts put by compare-and-set, stale keys purged, the resume revision last; and what a write
//! that did not (wholly) happen leaves for the next.

use std::collections::HashMap;

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::StreamExt;

use super::leader::still_ours;
use super::shards::{SHARD_PREFIX, encode_parts, encode_shard, shard_and_part, shard_key};
use super::{ABSENT, CheckpointError, LEADER_KEY, RESUME_KEY, SPARK_KEY};
use crate::leadership::Fence;

/// Writes in flight at once when flushing.
const FLUSH_CONCURRENCY: usize = 64;

#[derive(Debug, Default)]
pub(super) struct Written {
    /// (shard, part, revision).
    pub(super) shards: Vec<(usize, usize, u64)>,
    /// Shards written whole: how many of their parts hold pods now.
    pub(super) live_parts: Vec<(usize, usize)>,
    pub(super) resume: Option<u64>,
    pub(super) leader: Option<u64>,
    pub(super) spark: Option<u64>,
}

/// A write that failed: the error, and what it was to write, to be written again.
pub(super) struct WriteFailed {
    pub(super) error: CheckpointError,
    pub(super) shards: Vec<usize>,
    pub(super) stale: Vec<String>,
    pub(super) resume: bool,
    pub(super) spark: bool,
}

/// One write: shards to put (an empty value for a shard left without pods), stale keys to
/// purge, the resume revision, each at the KV revision expected.
#[derive(Default)]
pub(super) struct Write {
    /// Each shard's pods (their events, shared, not copied), the expected revision of each
    /// of its parts' keys, and how many parts held pods: encoded only as it is written, so a
    /// write holds a few shard values at a time, not the whole checkpoint twice.
    pub(super) shards: Vec<ShardWrite>,
    /// The most bytes one part's value may take.
    pub(super) part_limit: usize,
    pub(super) stale: Vec<String>,
    pub(super) resume: Option<(u64, u64)>,
    /// The Spark objects' events and the expected revision of their key.
    pub(super) spark: Option<(Vec<Bytes>, u64)>,
    /// The `leader` value and its expected revision: set first, proving the claim holds.
    pub(super) claim: Option<(Bytes, u64)>,
    pub(super) fence: Fence,
}

/// One shard of a [`Write`].
pub(super) struct ShardWrite {
    pub(super) shard: usize,
    pub(super) pods: Vec<Bytes>,
    pub(super) revisions: Vec<u64>,
    pub(super) live_parts: usize,
}

impl Write {
    pub(super) fn is_empty(&self) -> bool {
        self.shards.is_empty()
            && self.stale.is_empty()
            && self.resume.is_none()
            && self.spark.is_none()
    }
}

/// A compare-and-set that did not happen.
enum Refused {
    /// The key is not at the revision expected: someone wrote it, or a write of ours whose
    /// ack was lost did.
    Moved,
    /// Anything else (NATS down, a timeout): retried with the next write.
    Failed(CheckpointError),
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
        Err(source) => Err(Refused::Failed(CheckpointError::Write {
            key: key.to_owned(),
            source,
        })),
    }
}

#[derive(Default)]
struct Refusals {
    moved: Vec<String>,
    failed: Option<CheckpointError>,
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
    ) -> CheckpointError {
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
        self.failed.unwrap_or(CheckpointError::MovedByUs)
    }
}

/// Proves the claim (the `leader` key), writes the shards, then purges stale keys, then the
/// resume revision (only once the pods it covers are written); nothing once the fence closed.
pub(super) async fn write_out(kv: kv::Store, write: Write) -> (Written, Result<(), WriteFailed>) {
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
    let failure = |error: CheckpointError, stale: Vec<String>| WriteFailed {
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
            let error = CheckpointError::Purge {
                key: key.clone(),
                source: error,
            };
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

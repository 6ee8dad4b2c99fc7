//! The `leader` key: who writes the checkpoint. Read with patience while the bucket cannot
//! answer yet, and read again when a key moved under a writer, to tell a lost ack of its own
//! from another ingest's claim.

use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::{ABSENT, CheckpointError, LEADER_KEY};
use crate::leadership::Deposed;

/// replicated bucket just created, or electing a leader after a node died: "no responders").
const LEADER_READ_PATIENCE: Duration = Duration::from_secs(30);

/// The `leader` key, read again while the bucket does not answer, for up to
/// [`LEADER_READ_PATIENCE`]: an ingest started beside a JetStream cluster that is still
/// electing must wait for it, not exit.
pub(super) async fn read_leader(kv: &kv::Store) -> Result<Option<kv::Entry>, CheckpointError> {
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
                return Err(CheckpointError::Leader(error));
            }
        }
    }
}

/// After a key moved under this writer: if the `leader` key still holds this writer's claim,
/// nobody else writes (the move was a write of ours whose ack was lost), and the keys'
/// current revisions are taken for the next write; otherwise this writer is [`Deposed`].
pub(super) async fn still_ours(
    kv: &kv::Store,
    claim: Option<&Bytes>,
    moved: &[String],
) -> Result<Vec<(String, u64)>, CheckpointError> {
    let leader = kv
        .entry(LEADER_KEY)
        .await
        .map_err(CheckpointError::Leader)?;
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
                .map_err(|source| CheckpointError::Entry {
                    key: key.clone(),
                    source,
                })?
                .map_or(ABSENT, |entry| entry.revision)
        };
        current.push((key.clone(), revision));
    }
    Ok(current)
}

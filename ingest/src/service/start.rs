//! The ingest's start: its Kubernetes permissions asked of the API server, the checkpoint
//! interval checked against the duplicate window, on the bus with its streams, the Lease won (a standby waits here), then the checkpoint claimed
//! and loaded.

use std::time::Duration;

use podstream_bus::{Condition, OnTheBus};

use super::publishing::Ingest;
use super::watch::BURST;
use super::{IngestConfig, IngestError, IngestStats, worker_selector};
use crate::access;
use crate::checkpoint::Checkpoint;
use crate::known::KnownPods;
use crate::leadership::{self, Fence, Leadership};
use crate::publisher::Publisher;
use crate::spark::KnownSpark;

/// A started ingest: its publishing side and, under an election, its Lease.
pub(super) struct Started {
    pub ingest: Ingest,
    pub leadership: Option<Leadership>,
}

/// Connects, makes the streams ready, waits to lead, claims and loads the checkpoint; `None`
/// when `shutdown` came while standing by.
pub(super) async fn start(
    config: &IngestConfig,
    kube: &kube::Client,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Option<Started>, IngestError> {
    let health = &config.health;
    let needed = access::needed(&config.namespaces, config.lease.as_ref(), config.spark);
    if access::require(kube, &needed).await? == access::Checked::Granted {
        tracing::info!(
            permissions = needed.len(),
            "the ingest's Kubernetes permissions are granted"
        );
    }
    // Before connecting, against the window given (or the default); after, against the
    // stream's own.
    fits_the_duplicate_window(
        config.checkpoint_interval,
        config
            .bus
            .streams
            .duplicate_window
            .unwrap_or_else(podstream_bus::config::default_duplicate_window),
    )?;
    let wanted = super::streams(config);
    let OnTheBus {
        js,
        subjects,
        streams: ready,
    } = podstream_bus::start(&config.bus, super::CLIENT, &wanted).await?;
    let pods = &ready[0];
    fits_the_duplicate_window(config.checkpoint_interval, pods.duplicate_window)?;
    // A standby waits here, connected; SIGTERM ends the wait.
    let leadership = match &config.lease {
        Some(lease) => {
            // Standing by is this replica's job until it leads: ready.
            health.set(Condition::WatchSynced, true);
            tokio::select! {
                led = Leadership::acquire(kube.clone(), lease) => Some(led?),
                () = shutdown => return Ok(None),
            }
        }
        None => None,
    };
    health.set(Condition::WatchSynced, false);
    metrics::gauge!(podstream_bus::metrics::INGEST_LEADER).set(1.0);
    let fence = leadership
        .as_ref()
        .map_or_else(Fence::open, |led| led.fence.clone());
    let mut checkpoint = Checkpoint::open(
        &js,
        &config.checkpoint_bucket,
        pods.num_replicas,
        config.checkpoint_interval,
        fence.clone(),
    )
    .await?;
    let identity = config
        .lease
        .as_ref()
        .map_or_else(leadership::identity, |lease| lease.identity.clone());
    checkpoint.claim(&identity).await?;
    let restored = checkpoint.load().await?;
    tracing::info!(pods = restored.pods.len(), spark = restored.spark.len(), resume = ?restored.resume, "checkpoint loaded");
    let ingest = Ingest {
        cursor: restored.resume,
        subjects,
        selector: worker_selector(config.pod_selector.as_deref()),
        known: KnownPods::from_events(restored.pods),
        spark: KnownSpark::from_events(restored.spark),
        publisher: Publisher::new(js, config.ack_window, fence),
        checkpoint,
        stats: IngestStats::default(),
        staged: Vec::with_capacity(BURST),
        deposed: None,
        dead_made: hashlink::LruCache::new(super::publishing::DEAD_LETTERS_REMEMBERED),
    };
    Ok(Some(Started { ingest, leadership }))
}

/// Crash recovery republishes what was published since the last checkpoint write; only the
/// duplicate window makes that harmless, so the checkpoint is written well within it.
fn fits_the_duplicate_window(
    checkpoint_interval: Duration,
    window: Duration,
) -> Result<(), IngestError> {
    if checkpoint_interval * 2 > window {
        return Err(IngestError::Window {
            interval: checkpoint_interval,
            window,
        });
    }
    Ok(())
}

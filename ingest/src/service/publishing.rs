//! What the watch loop publishes, in order: each projected pod's messages (its event, an
//! owner notice, nothing for a revision already published, or its dead letter), history
//! replayed after a list, synthesized deletes, Spark objects' events; then the acks taken
//! into the known pods and the checkpoint.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use podstream_proto::PodEvent;
use podstream_proto::subject::Subjects;
use podstream_proto::v1::EventType;
use tokio::time::Instant;

use super::IngestStats;
use super::projected::{Projected, project};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::known::{KnownPods, Outgoing, Sighting, UidSet};
use crate::leadership::Deposed;
use crate::listing::{FinishedList, ListAction};
use crate::publisher::{Acked, Message, Publisher};
use crate::spark::{KnownSpark, SparkProjected, SparkScope};
use crate::watched_pod::WatchedPod;

/// How long a stopping ingest retries its last checkpoint write: a JetStream raft group
/// takes up to about ten seconds to elect a new leader, and Kubernetes waits 30 s by default
/// between SIGTERM and SIGKILL.
const FINAL_FLUSH_FOR: Duration = Duration::from_secs(20);

/// How long a history replay waits for the next event before it counts as caught up.
const REPLAY_IDLE: Duration = Duration::from_millis(200);

/// The publishing side of the ingest.
pub(super) struct Ingest {
    /// The newest revision seen in watch order: where a history replay starts.
    pub cursor: Option<u64>,
    pub subjects: Subjects,
    /// The label selector of the watch and its history replays ([`worker_selector`]).
    pub selector: String,
    pub known: KnownPods,
    pub spark: KnownSpark,
    pub publisher: Publisher,
    pub checkpoint: Checkpoint,
    pub stats: IngestStats,
    /// Messages made and not yet sent, in order.
    pub staged: Vec<Message>,
    /// Why this ingest may write nothing more, once the checkpoint said so.
    pub deposed: Option<Deposed>,
    /// Ids of the pods' dead letters already made: a pod that stays unusable is one dead
    /// letter per reason, not one per revision.
    pub dead_made: hashlink::LruCache<String, ()>,
}

/// Dead letters an ingest remembers having made (pods that stay unusable), a few hundred
/// bytes each.
pub(super) const DEAD_LETTERS_REMEMBERED: usize = 10_000;

impl Ingest {
    /// Publishes a completed list: history replayed first, then the listed pods, then
    /// synthesized deletes for known pods that vanished.
    pub(super) async fn after_list(
        &mut self,
        scope: Option<&str>,
        api: Option<Api<WatchedPod>>,
        listing: FinishedList<Projected>,
    ) {
        let listed = listing.seen.len();
        let mut seen = listing.seen;
        if let (Some(rv), Some(api)) = (listing.replay_from, api) {
            seen.extend(self.replay(scope, &api, rv).await);
        }
        for item in listing.items {
            self.publish_projected(item, Sighting::Listing).await;
        }
        let synthesized = self.known.vanished(&self.subjects, scope, &seen);
        if !synthesized.is_empty() {
            tracing::info!(count = synthesized.len(), namespace = ?scope, "pods vanished while unwatched; synthesizing deletes");
        }
        for out in synthesized {
            self.send(Message::Pod(Box::new(out))).await;
        }
        tracing::info!(namespace = ?scope, listed, known = self.known.len(), "list done; watching");
        self.checkpoint_acked().await;
    }

    /// Replays the apiserver's history after `rv` with a short watch; returns the uids seen.
    /// A 410 (history gone) or an error ends it early: the list then stands for what is lost.
    async fn replay(&mut self, scope: Option<&str>, api: &Api<WatchedPod>, rv: u64) -> UidSet {
        let mut touched = UidSet::default();
        let params = WatchParams::default()
            .labels(&self.selector)
            .timeout(1)
            .disable_bookmarks();
        let mut stream = match api.watch(&params, &rv.to_string()).await {
            Ok(stream) => stream.boxed(),
            Err(error) => {
                tracing::warn!(namespace = ?scope, %error, "cannot replay history; the list stands for it");
                return touched;
            }
        };
        // History arrives at once; a quiet moment means the replay has caught up, and the
        // list stands for anything after it.
        while let Ok(Some(item)) = tokio::time::timeout(REPLAY_IDLE, stream.next()).await {
            let (kind, pod) = match item {
                Ok(WatchEvent::Added(pod)) => (EventType::Added, pod),
                Ok(WatchEvent::Modified(pod)) => (EventType::Modified, pod),
                Ok(WatchEvent::Deleted(pod)) => (EventType::Deleted, pod),
                Ok(WatchEvent::Bookmark(_)) => continue,
                Ok(WatchEvent::Error(status)) => {
                    tracing::info!(namespace = ?scope, code = status.code, message = %status.message, "history since the last revision is gone; the list stands for it");
                    break;
                }
                Err(error) => {
                    tracing::warn!(namespace = ?scope, %error, "history replay interrupted; the list stands for the rest");
                    break;
                }
            };
            if let Some(uid) = pod.metadata.uid.clone() {
                touched.insert(uid);
            }
            self.observe(kind, pod, Sighting::Listing).await;
        }
        tracing::info!(namespace = ?scope, replayed = touched.len(), from = rv, "replayed history");
        touched
    }

    /// Carries out what a Spark watch item called for (see [`crate::spark::SparkWatches::step`]).
    pub(super) async fn on_spark(
        &mut self,
        scope: &SparkScope,
        action: ListAction<SparkProjected>,
    ) {
        match action {
            ListAction::Hold => {}
            ListAction::Flush => self.send_staged().await,
            ListAction::Publish(object, _) => {
                self.stage_spark(object);
                self.send_staged().await;
            }
            ListAction::Finish(finished) => {
                self.send_staged().await;
                self.after_spark_list(scope, &finished.seen).await;
            }
        }
    }

    /// Stages what a Spark object's event calls for: the event, nothing for a revision
    /// already published, or its dead letter.
    fn stage_spark(&mut self, projected: SparkProjected) {
        match projected {
            SparkProjected::Event(event) => {
                if let Some(out) = self.spark.observe(&self.subjects, *event) {
                    self.staged.push(Message::Spark(Box::new(out)));
                } else {
                    self.stats.skipped += 1;
                }
            }
            SparkProjected::Unusable(dead) => self.staged.push(Message::Dead(*dead)),
        }
    }

    /// A completed Spark list: synthesized deletes for the known objects of its kind and
    /// scope that vanished (the listed ones were published as they came).
    async fn after_spark_list(&mut self, scope: &SparkScope, seen: &UidSet) {
        let vanished =
            self.spark
                .vanished(&self.subjects, scope.kind, scope.namespace.as_deref(), seen);
        if !vanished.is_empty() {
            tracing::info!(count = vanished.len(), kind = scope.kind.token(), namespace = ?scope.namespace, "Spark objects vanished while unwatched; synthesizing deletes");
        }
        for out in vanished {
            self.send(Message::Spark(Box::new(out))).await;
        }
        tracing::info!(kind = scope.kind.token(), namespace = ?scope.namespace, listed = seen.len(), known = self.spark.len(), "Spark list done; watching");
        self.checkpoint_acked().await;
    }

    async fn observe(&mut self, kind: EventType, pod: WatchedPod, sighting: Sighting) {
        let projected = project(&self.subjects, kind, pod);
        self.publish_projected(projected, sighting).await;
    }

    /// Publishes what a projected pod calls for (see [`Ingest::stage`]).
    async fn publish_projected(&mut self, projected: Projected, sighting: Sighting) {
        self.stage(projected, sighting);
        self.send_staged().await;
    }

    /// Makes the messages a projected pod calls for, to be sent by [`Ingest::send_staged`]:
    /// its event (and an owner notice), nothing for a revision already published, or its
    /// dead letter.
    pub(super) fn stage(&mut self, projected: Projected, sighting: Sighting) {
        let event = match projected {
            Projected::Event(event) => event,
            Projected::Unusable(dead) => {
                if self.dead_made.insert(dead.msg_id.clone(), ()).is_some() {
                    self.stats.skipped += 1;
                    return;
                }
                return self.staged.push(Message::Dead(*dead));
            }
        };
        if let Ok(rv) = event.resource_version.parse::<u64>()
            && self.cursor.is_none_or(|c| rv > c)
        {
            self.cursor = Some(rv);
        }
        let outgoing = self.known.observe(&self.subjects, *event, sighting);
        if outgoing.is_empty() {
            self.stats.skipped += 1;
        }
        self.staged
            .extend(outgoing.into_iter().map(|out| Message::Pod(Box::new(out))));
    }

    /// Sends the staged messages, in order.
    pub(super) async fn send_staged(&mut self) {
        let mut staged = std::mem::take(&mut self.staged);
        for message in staged.drain(..) {
            self.send(message).await;
        }
        // The buffer is kept for the next burst.
        self.staged = staged;
    }

    async fn send(&mut self, message: Message) {
        // Boxed in `Message`, so the window holds pointers, not 500-byte events.
        self.publisher.publish(message).await;
        self.record_acked();
    }

    /// Takes what JetStream acked into the known pods, the checkpoint and the counters.
    fn record_acked(&mut self) {
        for Acked { message, sequence } in self.publisher.take_acked() {
            match message {
                Message::Pod(out) => {
                    log_published(&out);
                    if out.role == crate::known::Role::Event {
                        let kind = match out.event.r#type() {
                            EventType::Added => "added",
                            EventType::Modified => "modified",
                            EventType::Deleted => "deleted",
                            EventType::Unspecified => "unspecified",
                        };
                        let synthesized = if out.event.synthesized {
                            "true"
                        } else {
                            "false"
                        };
                        metrics::counter!(podstream_bus::metrics::INGEST_EVENTS_PUBLISHED, "type" => kind, "synthesized" => synthesized).increment(1);
                    }
                    self.known.acked(&out, sequence);
                    self.stats.published += 1;
                    if out.event.synthesized {
                        self.stats.synthesized += 1;
                    }
                    self.checkpoint.record(&out);
                }
                Message::Spark(out) => {
                    tracing::debug!(subject = %out.subject, rv = %out.event.resource_version, synthesized = out.event.synthesized, "published");
                    self.stats.spark += 1;
                    self.checkpoint.record_spark(&out);
                }
                Message::Dead(_) => self.stats.dead_lettered += 1,
            }
        }
    }

    /// Records the acks that arrived and writes the checkpoint.
    pub(super) async fn checkpoint_acked(&mut self) {
        self.publisher.poll_acked().await;
        self.record_acked();
        match self.checkpoint.flush_in_background() {
            Some(CheckpointError::Deposed(deposed)) => self.deposed = Some(deposed),
            // A stale checkpoint only means republishing (deduplicated) after a restart.
            Some(error) => {
                tracing::warn!(error = %format!("{error:#}"), "checkpoint write failed; will retry")
            }
            None => {}
        }
    }

    /// Why this ingest must stop writing, if it must: its fence closed, or another ingest
    /// wrote the checkpoint.
    pub(super) fn deposed(&mut self) -> Option<Deposed> {
        if let Some(deposed) = self.deposed.take() {
            return Some(deposed);
        }
        self.publisher
            .deposed()
            .then(|| Deposed("the lease ran out before it was renewed".into()))
    }

    /// Drains what is in flight and writes the checkpoint a last time.
    pub(super) async fn stop(mut self) -> Result<IngestStats, Deposed> {
        self.publisher.drain().await;
        self.record_acked();
        if let Some(deposed) = self.deposed() {
            return Err(deposed);
        }
        self.final_flush().await?;
        tracing::info!(
            published = self.stats.published,
            synthesized = self.stats.synthesized,
            dead_lettered = self.stats.dead_lettered,
            skipped = self.stats.skipped,
            duplicates = self.publisher.duplicates(),
            "ingest stopped"
        );
        Ok(self.stats)
    }

    /// The last checkpoint write, retried for [`FINAL_FLUSH_FOR`] (a JetStream cluster
    /// electing the bucket's leader refuses writes meanwhile). Given up, it is no failure of
    /// the stop: a stale checkpoint only means the successor republishes, deduplicated.
    async fn final_flush(&mut self) -> Result<(), Deposed> {
        let give_up = Instant::now() + FINAL_FLUSH_FOR;
        let mut backoff =
            podstream_bus::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            match self.checkpoint.flush().await {
                Ok(()) => return Ok(()),
                Err(CheckpointError::Deposed(deposed)) => return Err(deposed),
                Err(error) if Instant::now() + backoff.delay() >= give_up => {
                    tracing::warn!(error = %format!("{error:#}"), "the last checkpoint write failed; a successor republishes what it missed");
                    return Ok(());
                }
                Err(error) => {
                    tracing::warn!(error = %format!("{error:#}"), retry_in_ms = backoff.delay().as_millis() as u64, "the last checkpoint write failed; retrying");
                    backoff.wait().await;
                }
            }
        }
    }
}

fn log_published(out: &Outgoing) {
    let event: &PodEvent = &out.event;
    let pod = event.pod.as_ref();
    tracing::debug!(
        pod = pod.map_or("", |p| p.name.as_str()),
        uid = pod.map_or("", |p| p.uid.as_str()),
        owner = %event.owner,
        ti = %event.task.as_ref().map(ToString::to_string).unwrap_or_default(),
        rv = %event.resource_version,
        role = out.role.as_str(),
        subject = %out.subject,
        "published"
    );
}

//! `podstream ingest`: watch every worker pod, publish each event once, checkpoint, repeat.
//!
//! Start: connect to NATS (retrying), make the streams and the checkpoint bucket ready, wait
//! to lead (see [`crate::leadership`]), claim and load the checkpoint. Then kube-runtime's `watcher` lists and watches. Every list (the first, and
//! one after each 410) is held back until it is complete, and then:
//! 1. if the ingest knows a revision it had reached (from the checkpoint, or its own watch),
//!    the apiserver's history since that revision is replayed with a short watch, so changes
//!    made while nobody watched arrive one by one, in order (a 410 skips this step);
//! 2. the listed pods follow: those at a revision already published are skipped, newer ones
//!    are published (changes whose history was gone arrive collapsed into their last state);
//! 3. pods the ingest knew that were neither listed nor replayed vanished unseen: each gets a
//!    synthesized delete.

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use bytes::Bytes;
use futures::{StreamExt, stream::BoxStream};
use kube::api::{Api, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use podstream_bus::BusConfig;
use podstream_bus::dead::DeadLetter;
use podstream_bus::streams;
use podstream_bus::{Condition, Health};
use podstream_proto::PodEvent;
use podstream_proto::msg_id;
use podstream_proto::subject::{Stream, Subjects};
use podstream_proto::v1::EventType;
use tokio::time::Instant;

use crate::checkpoint::Checkpoint;
use crate::known::{KnownPods, Outgoing, Sighting, UidSet};
use crate::leadership::{self, Deposed, Fence, Leadership, LeaseConfig};
use crate::listing::{FinishedList, ListAction, ListInput, ListState};
use crate::projection::OWNER_LABEL;
use crate::publisher::{Acked, Message, Publisher};
use crate::spark::{self, KnownSpark, SparkProjected, SparkWatched};
use crate::watched_pod::WatchedPod;

/// How often acks that arrived while nothing was published are collected.
const ACK_POLL: Duration = Duration::from_millis(50);

/// How long a stopping ingest retries its last checkpoint write: a JetStream raft group
/// takes up to about ten seconds to elect a new leader, and Kubernetes waits 30 s by default
/// between SIGTERM and SIGKILL.
const FINAL_FLUSH_FOR: Duration = Duration::from_secs(20);

/// Watch items read ahead of the publishing loop (a page of a list is 500 pods).
const READ_AHEAD: usize = 1024;

/// Watch items taken at most in one burst: their messages are made first and then sent back
/// to back, so the NATS connection writes them in a few large writes, not one each (which
/// cost the ingest and nats-server a syscall and a wakeup per message).
const BURST: usize = 256;

/// How long a history replay waits for the next event before it counts as caught up.
const REPLAY_IDLE: Duration = Duration::from_millis(200);

/// How the ingest runs.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// The NATS server, the subject prefix, the settings of the streams it creates.
    pub bus: BusConfig,
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// The kubeconfig context, when not the current one.
    pub kube_context: Option<String>,
    /// A label selector narrowing the watch to one Airflow deployment's worker pods
    /// (`--pod-selector`); `None` watches every worker pod.
    pub pod_selector: Option<String>,
    /// Publishes awaiting their ack at most.
    pub ack_window: usize,
    /// The checkpoint KV bucket.
    pub checkpoint_bucket: String,
    /// How often the checkpoint is written at most (see [`crate::checkpoint`]).
    pub checkpoint_interval: Duration,
    /// The Lease that elects one ingest among replicas; `None` runs without an election
    /// (one ingest per cluster, or the demo).
    pub lease: Option<LeaseConfig>,
    /// Also watch the driver pods of Airflow's Spark jobs and their SparkApplications
    /// (`--spark`, see [`crate::spark`]).
    pub spark: bool,
    /// Readiness: the watch synced (or standing by to lead).
    pub health: Health,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            bus: BusConfig::default(),
            namespaces: Vec::new(),
            kube_context: None,
            pod_selector: None,
            ack_window: DEFAULT_ACK_WINDOW,
            checkpoint_bucket: DEFAULT_CHECKPOINT_BUCKET.into(),
            checkpoint_interval: Duration::from_millis(DEFAULT_CHECKPOINT_INTERVAL_MS),
            lease: None,
            spark: false,
            health: Health::new(),
        }
    }
}

/// Publishes awaiting their ack at most, by default.
pub const DEFAULT_ACK_WINDOW: usize = 1024;
/// The checkpoint KV bucket by default.
pub const DEFAULT_CHECKPOINT_BUCKET: &str = "podstream-ingest";
/// The role in the name of a prefix's checkpoint bucket (`<prefix>-ingest`).
pub const CHECKPOINT_ROLE: &str = "ingest";
/// How often the checkpoint is written at most, by default, in milliseconds.
pub const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 1000;

/// Counters the ingest reports when it stops.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IngestStats {
    /// Pod events and owner notices acked.
    pub published: u64,
    /// Spark objects' events acked (`--spark`), synthesized deletes among them.
    pub spark: u64,
    /// Synthesized deletes among them.
    pub synthesized: u64,
    /// Dead letters acked.
    pub dead_lettered: u64,
    /// Watch events skipped because their revision was published already.
    pub skipped: u64,
}

impl std::fmt::Display for IngestStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} published ({} synthesized deletes), ",
            self.published, self.synthesized
        )?;
        if self.spark > 0 {
            write!(f, "{} Spark events, ", self.spark)?;
        }
        write!(f, "{} dead-lettered", self.dead_lettered)
    }
}

/// A Kubernetes client inferred like kubectl (`KUBECONFIG`, `~/.kube/config`, in-cluster),
/// with another context when asked.
pub async fn kube_client(context: Option<&str>) -> anyhow::Result<kube::Client> {
    let config = match context {
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)")?,
        Some(context) => {
            let options = kube::config::KubeConfigOptions {
                context: Some(context.to_owned()),
                ..Default::default()
            };
            kube::Config::from_kubeconfig(&options)
                .await
                .with_context(|| format!("kubeconfig context {context}"))?
        }
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Crash recovery republishes what was published since the last checkpoint write; only the
/// duplicate window makes that harmless, so the checkpoint is written well within it.
fn fits_the_duplicate_window(
    checkpoint_interval: Duration,
    window: Duration,
) -> anyhow::Result<()> {
    if checkpoint_interval * 2 > window {
        anyhow::bail!(
            "the checkpoint interval ({checkpoint_interval:?}) must be under half the duplicate window ({window:?})"
        );
    }
    Ok(())
}

/// Runs until `shutdown` resolves, then drains in-flight acks and the checkpoint.
pub async fn run(
    config: IngestConfig,
    kube: kube::Client,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<IngestStats> {
    let subjects = config.bus.subjects().context("invalid --prefix")?;
    let health = config.health.clone();
    health.declare(Condition::WatchSynced);
    metrics::gauge!(podstream_bus::metrics::INGEST_LEADER).set(0.0);
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
    let nats = podstream_bus::connect(
        &config.bus.nats_url,
        &config.bus.security,
        "podstream-ingest",
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
        streams::stream_config(&subjects, Stream::DeadLetters, &config.bus.streams),
    )
    .await?;
    fits_the_duplicate_window(config.checkpoint_interval, pods.duplicate_window)?;
    if config.spark {
        streams::ensure(
            &js,
            streams::stream_config(&subjects, Stream::Spark, &config.bus.streams),
        )
        .await?;
    }
    tokio::pin!(shutdown);
    // A standby waits here, connected; SIGTERM ends the wait.
    let mut leadership = match &config.lease {
        Some(lease) => {
            // Standing by is this replica's job until it leads: ready.
            health.set(Condition::WatchSynced, true);
            tokio::select! {
                led = Leadership::acquire(kube.clone(), lease) => Some(led?),
                _ = &mut shutdown => return Ok(IngestStats::default()),
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
    let mut ingest = Ingest {
        cursor: None,
        subjects,
        selector: worker_selector(config.pod_selector.as_deref()),
        known: KnownPods::from_events(restored.pods),
        spark: KnownSpark::from_events(restored.spark),
        publisher: Publisher::new(js, config.ack_window, fence),
        checkpoint,
        stats: IngestStats::default(),
        staged: Vec::with_capacity(BURST),
        deposed: None,
    };
    let scopes: Vec<Option<String>> = if config.namespaces.is_empty() {
        vec![None]
    } else {
        config.namespaces.iter().cloned().map(Some).collect()
    };
    let apis: Vec<(Option<String>, Api<WatchedPod>)> = scopes
        .into_iter()
        .map(|scope| {
            let api = match &scope {
                Some(ns) => Api::namespaced(kube.clone(), ns),
                None => Api::all(kube.clone()),
            };
            (scope, api)
        })
        .collect();

    ingest.cursor = restored.resume;
    let mut events = read_ahead(
        watch_all(&apis, ingest.subjects.clone(), &ingest.selector),
        READ_AHEAD,
    );
    let mut lists: Vec<ListState<Projected>> =
        (0..apis.len()).map(|_| ListState::Watching).collect();
    // Per scope: listed, and watching since without an error.
    let mut synced = vec![false; apis.len()];
    // Spark objects are not part of readiness: a cluster without the SparkApplication CRD
    // fails that watch until it is installed, and worker pods must not wait for it.
    let spark_scopes = if config.spark {
        spark::spark_scopes(&config.namespaces)
    } else {
        Vec::new()
    };
    let mut spark_lists: Vec<ListState<SparkProjected>> =
        spark_scopes.iter().map(|_| ListState::Watching).collect();
    let mut spark_events = (!spark_scopes.is_empty()).then(|| {
        read_ahead(
            spark::watch_spark(&kube, &spark_scopes, ingest.subjects.clone()),
            READ_AHEAD,
        )
    });
    let mut tick = tokio::time::interval(ACK_POLL);
    loop {
        if let Some(deposed) = ingest.deposed() {
            // Written nothing since the fence closed; exiting makes this a fresh standby.
            return Err(deposed);
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = lost(&mut leadership) => {
                return Err(Deposed("the lease was lost to another ingest".into()).into());
            }
            _ = tick.tick() => ingest.checkpoint_acked().await,
            Some((index, item)) = next_spark(&mut spark_events) => {
                let (Some(scope), Some(list)) = (spark_scopes.get(index), spark_lists.get_mut(index)) else {
                    continue;
                };
                match item {
                    SparkWatched::List(input) => match list.on(input, None) {
                        ListAction::Hold => {}
                        ListAction::Flush => ingest.send_staged().await,
                        ListAction::Publish(object, _) => {
                            ingest.stage_spark(object);
                            ingest.send_staged().await;
                        }
                        ListAction::Finish(finished) => {
                            ingest.send_staged().await;
                            ingest.after_spark_list(scope, &finished.seen).await;
                        }
                    },
                    SparkWatched::Failed(error) => {
                        tracing::warn!(kind = scope.kind.token(), namespace = ?scope.namespace, %error, "Spark watch failed; retrying with backoff");
                    }
                }
            }
            item = events.recv() => {
                let Some(first) = item else { break };
                // Whatever else the watch has ready joins this burst (see `BURST`).
                let mut next = Some(first);
                let mut taken = 0;
                while let Some((index, item)) = next.take() {
                    let scope = || apis.get(index).and_then(|(scope, _)| scope.as_deref());
                    match (item, lists.get_mut(index)) {
                        (Watched::List(input), Some(list)) => match list.on(input, ingest.cursor) {
                            ListAction::Hold => {}
                            ListAction::Flush => ingest.send_staged().await,
                            ListAction::Publish(pod, sighting) => ingest.stage(pod, sighting),
                            ListAction::Finish(finished) => {
                                metrics::counter!(podstream_bus::metrics::INGEST_LISTS).increment(1);
                                ingest.send_staged().await;
                                let api = apis.get(index).map(|(_, api)| api.clone());
                                ingest.after_list(scope(), api, finished).await;
                                if let Some(done) = synced.get_mut(index) {
                                    *done = true;
                                }
                                health.set(Condition::WatchSynced, synced.iter().all(|s| *s));
                            }
                        },
                        (Watched::List(_), None) => {}
                        (Watched::Failed(error), _) => {
                            if let Some(done) = synced.get_mut(index) {
                                *done = false;
                            }
                            health.set(Condition::WatchSynced, false);
                            if is_expired(&error) {
                                metrics::counter!(podstream_bus::metrics::INGEST_WATCH_EXPIRED).increment(1);
                                tracing::info!(namespace = ?scope(), "watch history gone (410); listing again");
                            } else {
                                metrics::counter!(podstream_bus::metrics::INGEST_WATCH_ERRORS).increment(1);
                                tracing::warn!(namespace = ?scope(), %error, "Kubernetes watch failed; retrying with backoff");
                            }
                        }
                    }
                    taken += 1;
                    if taken < BURST {
                        next = events.try_recv().ok();
                    }
                }
                ingest.send_staged().await;
            }
        }
    }
    let stats = ingest.stop().await;
    if let Some(leadership) = leadership {
        leadership.release().await;
    }
    stats
}

/// The next Spark watch item; never without `--spark`.
async fn next_spark(
    events: &mut Option<tokio::sync::mpsc::Receiver<(usize, SparkWatched)>>,
) -> Option<(usize, SparkWatched)> {
    match events {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves when a held lease is lost; never without an election.
async fn lost(leadership: &mut Option<Leadership>) {
    match leadership {
        Some(leadership) => leadership.lost().await,
        None => std::future::pending().await,
    }
}

/// A watch item as the publishing loop takes it: its pod already projected.
enum Watched {
    /// What the scope's list state machine takes (see [`crate::listing`]).
    List(ListInput<Projected>),
    /// The watch failed; kube-runtime retries with backoff.
    Failed(Box<watcher::Error>),
}

/// Whether the apiserver ended the watch with 410 Gone: its history was compacted past the
/// watch's revision, a routine event that a list answers, not a fault.
fn is_expired(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

impl Watched {
    fn of(
        subjects: &Subjects,
        item: Result<watcher::Event<WatchedPod>, watcher::Error>,
    ) -> Watched {
        let input = match item {
            Ok(watcher::Event::Init) => ListInput::Started,
            Ok(watcher::Event::InitApply(pod)) => ListInput::Listed {
                // Cloned, not taken: an unusable pod's dead letter names its uid.
                uid: pod.metadata.uid.clone(),
                pod: project(subjects, EventType::Added, pod),
            },
            Ok(watcher::Event::InitDone) => ListInput::Done,
            Ok(watcher::Event::Apply(pod)) => {
                ListInput::Changed(project(subjects, EventType::Modified, pod))
            }
            Ok(watcher::Event::Delete(pod)) => {
                ListInput::Changed(project(subjects, EventType::Deleted, pod))
            }
            Err(error) => return Watched::Failed(Box::new(error)),
        };
        Watched::List(input)
    }
}

/// The label selector of the worker-pod watch: every pod with the owner label, whoever owns
/// it (any value), narrowed by `--pod-selector` to one Airflow deployment's pods.
pub fn worker_selector(pod_selector: Option<&str>) -> String {
    match pod_selector.map(str::trim).filter(|s| !s.is_empty()) {
        Some(narrower) => format!("{OWNER_LABEL},{narrower}"),
        None => OWNER_LABEL.to_owned(),
    }
}

/// One watcher per scope, merged; items carry their scope's index.
fn watch_all(
    apis: &[(Option<String>, Api<WatchedPod>)],
    subjects: Subjects,
    selector: &str,
) -> BoxStream<'static, (usize, Watched)> {
    let streams: Vec<_> = apis
        .iter()
        .enumerate()
        .map(|(index, (_, api))| {
            let config = watcher::Config::default().labels(selector);
            let subjects = subjects.clone();
            watcher(api.clone(), config)
                .default_backoff()
                .map(move |item| (index, Watched::of(&subjects, item)))
                .boxed()
        })
        .collect();
    futures::stream::select_all(streams).boxed()
}

/// Drives `stream` in a task of its own, up to `depth` items ahead of its reader, keeping
/// their order. The watch parses and projects pods as it reads them (see [`WatchedPod`] and
/// [`Watched`]), so a list's next pages are fetched and projected on one core while the last
/// ones are published from the other. The task ends when the receiver is dropped.
fn read_ahead<T: Send + 'static>(
    mut stream: BoxStream<'static, T>,
    depth: usize,
) -> tokio::sync::mpsc::Receiver<T> {
    let (ahead, reader) = tokio::sync::mpsc::channel(depth.max(1));
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                () = ahead.closed() => break,
                item = stream.next() => item,
            };
            let Some(item) = item else { break };
            if ahead.send(item).await.is_err() {
                break;
            }
        }
    });
    reader
}

/// A pod as projected: its event, or the dead letter it becomes.
enum Projected {
    Event(Box<PodEvent>),
    Unusable(Box<DeadLetter>),
}

/// A watched pod's event of `kind`, or its dead letter.
fn project(subjects: &Subjects, kind: EventType, pod: WatchedPod) -> Projected {
    match pod.into_event(kind) {
        Ok(event) => Projected::Event(Box::new(event)),
        Err(unusable) => {
            let meta = unusable.metadata;
            let name = meta.name.unwrap_or_default();
            let namespace = meta.namespace.unwrap_or_default();
            let uid = meta.uid.unwrap_or_default();
            let rv = meta.resource_version.unwrap_or_default();
            let reason = unusable.reason;
            tracing::warn!(pod = %name, namespace = %namespace, uid = %uid, %reason, "unusable pod; dead-lettered");
            Projected::Unusable(Box::new(DeadLetter::of_object(
                subjects,
                msg_id::dead_pod(&uid, &rv),
                format!("pod {namespace}/{name} uid {uid} resourceVersion {rv}"),
                reason,
                Bytes::from(crate::dead_pod::kept(unusable.raw.get())),
            )))
        }
    }
}

struct Ingest {
    /// The newest revision seen in watch order: where a history replay starts.
    cursor: Option<u64>,
    subjects: Subjects,
    /// The label selector of the watch and its history replays ([`worker_selector`]).
    selector: String,
    known: KnownPods,
    spark: KnownSpark,
    publisher: Publisher,
    checkpoint: Checkpoint,
    stats: IngestStats,
    /// Messages made and not yet sent, in order.
    staged: Vec<Message>,
    /// Why this ingest may write nothing more, once the checkpoint said so.
    deposed: Option<anyhow::Error>,
}

impl Ingest {
    /// Publishes a completed list: history replayed first, then the listed pods, then
    /// synthesized deletes for known pods that vanished.
    async fn after_list(
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
    async fn after_spark_list(&mut self, scope: &spark::SparkScope, seen: &UidSet) {
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
    fn stage(&mut self, projected: Projected, sighting: Sighting) {
        let event = match projected {
            Projected::Event(event) => event,
            Projected::Unusable(dead) => return self.staged.push(Message::Dead(*dead)),
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
    async fn send_staged(&mut self) {
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
    async fn checkpoint_acked(&mut self) {
        self.publisher.poll_acked().await;
        self.record_acked();
        match self.checkpoint.flush_in_background() {
            Some(error) if error.is::<Deposed>() => self.deposed = Some(error),
            // A stale checkpoint only means republishing (deduplicated) after a restart.
            Some(error) => {
                tracing::warn!(error = %format!("{error:#}"), "checkpoint write failed; will retry")
            }
            None => {}
        }
    }

    /// Why this ingest must stop writing, if it must: its fence closed, or another ingest
    /// wrote the checkpoint.
    fn deposed(&mut self) -> Option<anyhow::Error> {
        if let Some(deposed) = self.deposed.take() {
            return Some(deposed);
        }
        self.publisher
            .deposed()
            .then(|| Deposed("the lease ran out before it was renewed".into()).into())
    }

    async fn stop(mut self) -> anyhow::Result<IngestStats> {
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
    async fn final_flush(&mut self) -> anyhow::Result<()> {
        let give_up = Instant::now() + FINAL_FLUSH_FOR;
        let mut backoff =
            podstream_bus::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            match self.checkpoint.flush().await {
                Ok(()) => return Ok(()),
                Err(error) if error.is::<Deposed>() => return Err(error),
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

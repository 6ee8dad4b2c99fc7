//! The worker-pod watches: one kube-runtime watcher per scope (a namespace, or all), merged,
//! each pod projected as it is read, read ahead of the publishing loop; and what a burst of
//! their items calls for.

use futures::{StreamExt, stream::BoxStream};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use podstream_bus::Condition;
use podstream_bus::Health;
use podstream_proto::subject::Subjects;
use podstream_proto::v1::EventType;

use super::projected::{Projected, project};
use super::publishing::Ingest;
use crate::listing::{ListAction, ListInput, ListState};
use crate::read_ahead::read_ahead;
use crate::watched_pod::WatchedPod;

/// Watch items read ahead of the publishing loop (a page of a list is 500 pods).
pub(super) const READ_AHEAD: usize = 1024;

/// Watch items taken at most in one burst: their messages are made first and then sent back
/// to back, so the NATS connection writes them in a few large writes, not one each (which
/// cost the ingest and nats-server a syscall and a wakeup per message).
pub(super) const BURST: usize = 256;

/// The worker-pod watches of one ingest.
pub(super) struct PodWatches {
    apis: Vec<(Option<String>, Api<WatchedPod>)>,
    events: tokio::sync::mpsc::Receiver<(usize, Watched)>,
    lists: Vec<ListState<Projected>>,
    /// Per scope: listed, and watching since without an error.
    synced: Vec<bool>,
}

impl PodWatches {
    /// Watches in `namespaces` (all when empty) with `selector`.
    pub(super) fn start(
        kube: &kube::Client,
        namespaces: &[String],
        subjects: Subjects,
        selector: &str,
    ) -> PodWatches {
        let scopes: Vec<Option<String>> = if namespaces.is_empty() {
            vec![None]
        } else {
            namespaces.iter().cloned().map(Some).collect()
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
        let events = read_ahead(watch_all(&apis, subjects, selector), READ_AHEAD);
        PodWatches {
            lists: (0..apis.len()).map(|_| ListState::Watching).collect(),
            synced: vec![false; apis.len()],
            apis,
            events,
        }
    }

    /// The next watch item with its scope's index; `None` once the watches have ended.
    pub(super) async fn recv(&mut self) -> Option<(usize, Watched)> {
        self.events.recv().await
    }

    /// Takes `first` and whatever else the watch has ready (up to [`BURST`]) into `ingest`,
    /// then sends what they staged; readiness follows each scope's list and watch.
    pub(super) async fn on_burst(
        &mut self,
        first: (usize, Watched),
        ingest: &mut Ingest,
        health: &Health,
    ) {
        let mut next = Some(first);
        let mut taken = 0;
        while let Some((index, item)) = next.take() {
            self.on_item(index, item, ingest, health).await;
            taken += 1;
            if taken < BURST {
                next = self.events.try_recv().ok();
            }
        }
        ingest.send_staged().await;
    }

    async fn on_item(&mut self, index: usize, item: Watched, ingest: &mut Ingest, health: &Health) {
        let scope = self.apis.get(index).and_then(|(scope, _)| scope.clone());
        match (item, self.lists.get_mut(index)) {
            (Watched::List(input), Some(list)) => match list.on(input, ingest.cursor) {
                ListAction::Hold => {}
                ListAction::Flush => ingest.send_staged().await,
                ListAction::Publish(pod, sighting) => ingest.stage(pod, sighting),
                ListAction::Finish(finished) => {
                    metrics::counter!(podstream_bus::metrics::INGEST_LISTS).increment(1);
                    ingest.send_staged().await;
                    let api = self.apis.get(index).map(|(_, api)| api.clone());
                    ingest.after_list(scope.as_deref(), api, finished).await;
                    if let Some(done) = self.synced.get_mut(index) {
                        *done = true;
                    }
                    health.set(Condition::WatchSynced, self.synced.iter().all(|s| *s));
                }
            },
            (Watched::List(_), None) => {}
            (Watched::Failed(error), _) => {
                if let Some(done) = self.synced.get_mut(index) {
                    *done = false;
                }
                health.set(Condition::WatchSynced, false);
                if is_expired(&error) {
                    metrics::counter!(podstream_bus::metrics::INGEST_WATCH_EXPIRED).increment(1);
                    tracing::info!(namespace = ?scope, "watch history gone (410); listing again");
                } else {
                    metrics::counter!(podstream_bus::metrics::INGEST_WATCH_ERRORS).increment(1);
                    tracing::warn!(namespace = ?scope, %error, "Kubernetes watch failed; retrying with backoff");
                }
            }
        }
    }
}

/// A watch item as the publishing loop takes it: its pod already projected.
pub(super) enum Watched {
    /// What the scope's list state machine takes (see [`crate::listing`]).
    List(ListInput<Projected>),
    /// The watch failed; kube-runtime retries with backoff.
    Failed(Box<watcher::Error>),
}

/// Whether the apiserver ended the watch with 410 Gone: its history was compacted past the
/// watch's revision, a routine event that a list answers, not a fault.
pub(super) fn is_expired(error: &watcher::Error) -> bool {
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

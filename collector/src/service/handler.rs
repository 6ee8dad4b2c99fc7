//! The collector's side of the consumer loop ([`podstream_bus::consume`]): each command
//! judged on its task instance's record, its pods deleted or labelled, then acked, or sent
//! back with the grace period left.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{AckKind, kv};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use podstream_bus::Held;
use podstream_bus::consume::{
    ConsumerLoop, DeadLetters, Decoded, Delivery, Handler, HandlerStopped, Pulling, Sharing,
};
use podstream_proto::subject::Stage;
use podstream_proto::v1::{Command, PodRef, TaskKey};
use podstream_rules::record::TaskRecord;
use prost::Message as _;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::CollectConfig;
use super::start::Started;
use crate::collected::{self, Action, Collected};
use crate::pods::{self, Answer};
use crate::rule::{self, Look, Reason, Settings, Verdict};
use crate::stats::CollectStats;

/// How soon a pod is judged again after the API server refused or its record lagged.
const AGAIN_AFTER: Duration = Duration::from_secs(2);

/// Runs the consumer loop until `stopped`.
pub(super) async fn run(
    started: Started,
    kube: kube::Client,
    config: &CollectConfig,
    stopped: watch::Receiver<bool>,
) -> CollectStats {
    let consumer = ConsumerLoop {
        consumer: started.consumer,
        sharing: Sharing::Pinned {
            stream: Box::new(started.commands),
            failover: config.failover,
        },
        pulling: Pulling {
            batch_size: config.concurrency.max(1),
            in_flight: started.in_flight,
            health: config.health.clone(),
        },
        dead: DeadLetters {
            js: started.js,
            subjects: started.subjects,
            stage: Stage::Collector,
        },
    };
    let collector = Collector {
        kube,
        records: started.records,
        collected: started.collected,
        settings: config.settings.clone(),
        busy: Mutex::new(HashSet::new()),
    };
    let mut handler = CommandHandler {
        collector: &collector,
        limit: config.concurrency.max(1),
        running: FuturesUnordered::new(),
        stats: CollectStats::default(),
    };
    match consumer.run(&mut handler, stopped).await {
        Ok(consumed) => handler.stats.dead_lettered += consumed.dead_lettered,
        Err(error) => warn!(%error, "the command consumer stopped"),
    }
    handler.stats
}

/// What judging and acting on pods needs.
struct Collector {
    kube: kube::Client,
    records: kv::Store,
    collected: kv::Store,
    settings: Settings,
    /// Uids being deleted or labelled now: a second command naming one waits for the first.
    busy: Mutex<HashSet<String>>,
}

/// Commands judged at once, `limit` at most.
struct CommandHandler<'c> {
    collector: &'c Collector,
    limit: usize,
    running: FuturesUnordered<BoxFuture<'c, CollectStats>>,
    stats: CollectStats,
}

impl Handler for CommandHandler<'_> {
    type Item = Command;
    type Done = CollectStats;

    fn decode(&self, message: &async_nats::jetstream::Message) -> Decoded<Command> {
        match Command::decode(message.payload.as_ref()) {
            // The processor publishes keys in bounds; a command from elsewhere must not make a
            // KV key the server refuses (judged again without end, it would never be acked).
            Ok(command) => match command.task.as_ref().map(TaskKey::check_bounds) {
                Some(Err(error)) => Decoded::Dead(error.to_string()),
                _ => Decoded::Item(command),
            },
            Err(error) => Decoded::Dead(format!("not a Command: {error}")),
        }
    }

    fn has_room(&self) -> bool {
        self.running.len() < self.limit
    }

    async fn take(&mut self, deliveries: Vec<Delivery<Command>>) -> Result<(), HandlerStopped> {
        for delivery in deliveries {
            self.running.push(
                self.collector
                    .command(delivery.item, delivery.message)
                    .boxed(),
            );
        }
        Ok(())
    }

    async fn finished(&mut self) -> Option<CollectStats> {
        self.running.next().await
    }

    async fn after(&mut self, one: CollectStats) {
        self.stats += one;
    }
}

/// The pod a call is about, and why.
struct What<'a> {
    pod: &'a PodRef,
    task: &'a TaskKey,
    reason: Reason,
    action: Action,
    driver: Option<&'a PodRef>,
}

/// What became of one pod.
enum Acted {
    /// Done with it (collected now or before, or left alone).
    Done,
    /// Judge it again after this long.
    Again(Duration),
}

impl Collector {
    /// Judges and acts on what `command` names; acks it, or sends it back for later.
    async fn command(&self, command: Command, message: Held) -> CollectStats {
        let mut stats = CollectStats::default();
        let age = age(&message);
        let mut again: Option<Duration> = None;
        for look in rule::looks(&command) {
            let task = match &look {
                Look::Superseded { earlier, .. } => earlier,
                Look::Finished { .. } | Look::Losers { .. } => match &command.task {
                    Some(task) => task,
                    None => continue,
                },
            };
            let record = match self.record(task).await {
                Ok(record) => record,
                Err(error) => {
                    warn!(%error, ti = %task, "reading the task record failed; judging again later");
                    again = sooner(again, AGAIN_AFTER);
                    continue;
                }
            };
            for verdict in rule::judge(&look, record.as_ref(), age, &self.settings) {
                if let Acted::Again(after) = self.act(&verdict, task, &mut stats).await {
                    again = sooner(again, after);
                }
            }
        }
        match again {
            Some(delay) => {
                stats.delayed += 1;
                if let Err(error) = message.ack_with(AckKind::Nak(Some(delay))).await {
                    debug!(%error, "nak failed; the command comes back after the ack wait");
                }
            }
            None => {
                stats.commands += 1;
                podstream_bus::consume::ack(&message).await;
            }
        }
        stats
    }

    /// The processor's record of `task`, `None` when it has none (or one this release cannot
    /// read: a pod is then judged on the command alone, which deletes only a finished pod).
    async fn record(&self, task: &TaskKey) -> Result<Option<TaskRecord>, kv::EntryError> {
        let Some(bytes) = self.records.get(TaskRecord::key(task)).await? else {
            return Ok(None);
        };
        match TaskRecord::decode(&bytes) {
            Ok(record) => Ok(Some(record)),
            Err(error) => {
                warn!(%error, ti = %task, "the task record does not decode; judging without it");
                Ok(None)
            }
        }
    }

    /// Carries out one verdict.
    async fn act(&self, verdict: &Verdict, task: &TaskKey, stats: &mut CollectStats) -> Acted {
        let pod = verdict.pod();
        match verdict {
            Verdict::Keep { why, .. } => {
                debug!(pod = %pod, uid = %pod.uid, ti = %task, why = why.as_str(), "pod kept");
                Acted::Done
            }
            Verdict::Wait { reason, left, .. } => {
                debug!(pod = %pod, uid = %pod.uid, ti = %task, reason = reason.as_str(), left_ms = left.as_millis() as u64, "pod waits out its grace period");
                Acted::Again(*left)
            }
            Verdict::Delete {
                reason,
                resource_version,
                driver,
                ..
            } => {
                let what = What {
                    pod,
                    task,
                    reason: *reason,
                    action: Action::Deleted,
                    driver: driver.as_ref(),
                };
                self.once(what, stats, || {
                    pods::delete(&self.kube, pod, resource_version.as_deref())
                })
                .await
            }
            Verdict::MarkDone { .. } => {
                let what = What {
                    pod,
                    task,
                    reason: Reason::Finished,
                    action: Action::LabelledDone,
                    driver: None,
                };
                self.once(what, stats, || pods::mark_done(&self.kube, pod))
                    .await
            }
        }
    }

    /// Makes `call` on the pod unless it was made before (the bucket) or is being made now;
    /// records it once the API server answered.
    async fn once<F>(
        &self,
        what: What<'_>,
        stats: &mut CollectStats,
        call: impl FnOnce() -> F,
    ) -> Acted
    where
        F: Future<Output = Result<Answer, pods::CallError>>,
    {
        let What {
            pod,
            task,
            reason,
            action,
            driver,
        } = what;
        let key = collected::key(&pod.uid);
        match self.collected.get(&key).await {
            Ok(Some(_)) => return Acted::Done,
            Ok(None) => {}
            Err(error) => {
                warn!(%error, pod = %pod, "reading the pods collected failed; judging again later");
                return Acted::Again(AGAIN_AFTER);
            }
        }
        if !self.claim(&pod.uid) {
            return Acted::Again(AGAIN_AFTER);
        }
        let answered = call().await;
        self.release(&pod.uid);
        let answer = match answered {
            Ok(answer) => answer,
            Err(error) => {
                warn!(error = %podstream_bus::retry::with_causes(&error), pod = %pod, uid = %pod.uid, ti = %task, "the API server refused; trying again later");
                return Acted::Again(AGAIN_AFTER);
            }
        };
        match answer {
            Answer::Changed => {
                debug!(pod = %pod, uid = %pod.uid, "the pod changed since it was judged; judging again");
                return Acted::Again(AGAIN_AFTER);
            }
            Answer::Done => {
                metrics::counter!(podstream_bus::metrics::COLLECTOR_PODS, "reason" => reason.as_str(), "action" => action.as_str()).increment(1);
            }
            Answer::Gone | Answer::Replaced => {}
        }
        match action {
            Action::Deleted => stats.deleted += 1,
            Action::LabelledDone => stats.labelled_done += 1,
        }
        let driving = driver.map(ToString::to_string).unwrap_or_default();
        info!(pod = %pod, uid = %pod.uid, ti = %task, reason = reason.as_str(), action = action.as_str(), answer = answer.as_str(), driver = %driving, "pod collected");
        let record = Collected {
            pod: pod.clone(),
            ti: task.clone(),
            reason,
            action,
            answer,
            driver: driver.cloned(),
        };
        if let Err(error) = self.collected.put(&key, record.encode().into()).await {
            // The API answered: a second call later finds the pod gone, which is harmless.
            warn!(%error, pod = %pod, "recording the pod collected failed");
        }
        Acted::Done
    }

    fn claim(&self, uid: &str) -> bool {
        match self.busy.lock() {
            Ok(mut busy) => busy.insert(uid.to_owned()),
            Err(poisoned) => poisoned.into_inner().insert(uid.to_owned()),
        }
    }

    fn release(&self, uid: &str) {
        match self.busy.lock() {
            Ok(mut busy) => busy.remove(uid),
            Err(poisoned) => poisoned.into_inner().remove(uid),
        };
    }
}

/// The sooner of `again` (when there is one) and `after`.
fn sooner(again: Option<Duration>, after: Duration) -> Option<Duration> {
    Some(again.map_or(after, |a| a.min(after)))
}

/// How long ago the command was published (zero when the server did not say).
fn age(message: &async_nats::jetstream::Message) -> Duration {
    message
        .info()
        .ok()
        .map(|info| time::OffsetDateTime::now_utc() - info.published)
        .and_then(|age| Duration::try_from(age).ok())
        .unwrap_or_default()
}

//! Which worker pods the collector deletes, and when (docs/semantics.md "Collecting worker
//! pods"). Pure: a command and the processor's record of its task instance in, verdicts out.
//!
//! A command says where to look: a pod whose try ended ([`Look::Finished`]), the losers of a
//! duplicate record ([`Look::Losers`]), or the pods of the try before a try that now runs
//! ([`Look::Superseded`]). Each pod is then judged on the record as it is now, never on the
//! command alone, so a pod that has come to drive its try since is kept.

use std::time::Duration;

use podstream_proto::v1::{Command, Phase, PodRef, TaskKey, command::Kind};
use podstream_rules::duplicates;
use podstream_rules::record::TaskRecord;
use podstream_rules::state::Candidate;

/// The fail reason of a pod deleted while it ran: someone is deleting it already.
const DELETED_WHILE_RUNNING: &str = "deleted_while_running";

/// How the collector treats pods, as Airflow's `[kubernetes_executor]` settings say and the
/// trust the records allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `delete_worker_pods`: delete a pod whose try ended; otherwise label it done.
    pub delete_worker_pods: bool,
    /// `delete_worker_pods_on_failure`: with `delete_worker_pods`, delete failed pods too;
    /// otherwise they stay for inspection, as the stock executor leaves them.
    pub delete_worker_pods_on_failure: bool,
    /// How long a losing duplicate or a pod of a superseded try stays before it is deleted.
    pub grace: Duration,
    /// Live losers and live pods of superseded tries may be deleted: only where every
    /// candidate is an executor's own pod (`podstream process --require-signed-pods`), for a
    /// copy that wins the order would otherwise get the real pod deleted.
    pub live_pods: bool,
    /// The namespaces whose pods may be collected (its Role's); empty: every namespace.
    pub namespaces: Vec<String>,
}

/// Airflow's own defaults: delete pods that succeeded, keep failed ones.
pub const DEFAULT_DELETE_WORKER_PODS: bool = true;
/// Airflow's own default for `delete_worker_pods_on_failure`.
pub const DEFAULT_DELETE_WORKER_PODS_ON_FAILURE: bool = false;
/// Seconds a losing duplicate or a superseded try's pod is left before it is deleted.
pub const DEFAULT_GRACE_SECONDS: u64 = 300;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            delete_worker_pods: DEFAULT_DELETE_WORKER_PODS,
            delete_worker_pods_on_failure: DEFAULT_DELETE_WORKER_PODS_ON_FAILURE,
            grace: Duration::from_secs(DEFAULT_GRACE_SECONDS),
            live_pods: false,
            namespaces: Vec::new(),
        }
    }
}

/// Why a pod is collected: the label of the collector's counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Its try ended.
    Finished,
    /// It lost to another pod of its task instance (seed 003).
    Duplicate,
    /// Its try was superseded by a later one.
    Stale,
}

impl Reason {
    /// The metric label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Finished => "finished",
            Reason::Duplicate => "duplicate",
            Reason::Stale => "stale",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// How a pod's try ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `completed`: the pod succeeded.
    Succeeded,
    /// `fail`: the pod failed the task.
    Failed,
}

/// Where a command tells the collector to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// The pod whose try ended, as the command reports it.
    Finished {
        /// The pod.
        pod: PodRef,
        /// How.
        ending: Ending,
    },
    /// The pods that lost to the chosen one.
    Losers {
        /// The losers the command names.
        others: Vec<PodRef>,
    },
    /// The try before this command's, which runs now: its pods are stale.
    Superseded {
        /// The superseded try's key.
        earlier: TaskKey,
        /// The later try's pod, which runs.
        by: PodRef,
    },
}

/// Where `command` tells the collector to look. A pod already being deleted (a loss, a fail
/// for a deletion) asks for nothing.
pub fn looks(command: &Command) -> Vec<Look> {
    let pod = || command.pod.clone().unwrap_or_default();
    match &command.kind {
        Some(Kind::Completed(_)) => vec![Look::Finished {
            pod: pod(),
            ending: Ending::Succeeded,
        }],
        Some(Kind::Fail(fail)) if fail.reason != DELETED_WHILE_RUNNING => vec![Look::Finished {
            pod: pod(),
            ending: Ending::Failed,
        }],
        Some(Kind::Duplicate(duplicate)) => vec![Look::Losers {
            others: duplicate.others.clone(),
        }],
        Some(Kind::Running(_)) => match &command.task {
            Some(task) if task.try_number > 1 => vec![Look::Superseded {
                earlier: TaskKey {
                    try_number: task.try_number - 1,
                    ..task.clone()
                },
                by: pod(),
            }],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// What the collector does about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Delete it, on the preconditions given.
    Delete {
        /// The pod; its uid is always a precondition.
        pod: PodRef,
        /// Why.
        reason: Reason,
        /// A resourceVersion precondition too: the pod is live, and must be as judged.
        resource_version: Option<String>,
        /// The pod that drives instead: the chosen one for a duplicate, the later try's for
        /// a stale pod.
        driver: Option<PodRef>,
    },
    /// Label it `airflow_executor_done=True` (`delete_worker_pods` is off).
    MarkDone {
        /// The pod.
        pod: PodRef,
    },
    /// Judge it again after `left`.
    Wait {
        /// The pod.
        pod: PodRef,
        /// Why it would be deleted.
        reason: Reason,
        /// How much of the grace period is left.
        left: Duration,
    },
    /// Leave it.
    Keep {
        /// The pod.
        pod: PodRef,
        /// Why.
        why: Kept,
    },
}

impl Verdict {
    /// The pod judged.
    pub fn pod(&self) -> &PodRef {
        match self {
            Verdict::Delete { pod, .. }
            | Verdict::MarkDone { pod }
            | Verdict::Wait { pod, .. }
            | Verdict::Keep { pod, .. } => pod,
        }
    }
}

/// Why a pod is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// It drives its task instance.
    Drives,
    /// It is being deleted already.
    Terminating,
    /// It is gone.
    Gone,
    /// It is no candidate of its task instance (a foreign pod, or one the record never had).
    NotACandidate,
    /// It is a live pod of a superseded try, and live pods are not collected
    /// ([`Settings::live_pods`]); its own ending will be.
    Live,
    /// It failed and failed pods stay for inspection (`delete_worker_pods_on_failure`).
    FailedKept,
    /// It is in a namespace the collector does not collect ([`Settings::namespaces`]).
    Elsewhere,
}

impl Kept {
    /// The log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Kept::Drives => "drives",
            Kept::Terminating => "terminating",
            Kept::Gone => "gone",
            Kept::NotACandidate => "not_a_candidate",
            Kept::Live => "live",
            Kept::FailedKept => "failed_kept",
            Kept::Elsewhere => "elsewhere",
        }
    }
}

/// The pods of `record` as judged for the first time `age` after the command that named them
/// was published.
pub fn judge(
    look: &Look,
    record: Option<&TaskRecord>,
    age: Duration,
    settings: &Settings,
) -> Vec<Verdict> {
    let verdicts = match look {
        Look::Finished { pod, ending } => vec![finished(pod, *ending, record, settings)],
        Look::Losers { others } => others
            .iter()
            .map(|pod| loser(pod, record, age, settings))
            .collect(),
        Look::Superseded { by, .. } => superseded(record, by, age, settings),
    };
    verdicts
        .into_iter()
        .map(|verdict| within(verdict, &settings.namespaces))
        .collect()
}

/// `verdict`, or Keep when its pod is outside `namespaces` (none: every namespace is in).
fn within(verdict: Verdict, namespaces: &[String]) -> Verdict {
    let outside = !namespaces.is_empty() && !namespaces.contains(&verdict.pod().namespace);
    match verdict {
        Verdict::Keep { .. } => verdict,
        _ if outside => Verdict::Keep {
            pod: verdict.pod().clone(),
            why: Kept::Elsewhere,
        },
        _ => verdict,
    }
}

/// A pod whose try ended: deleted at once, or labelled done, as Airflow's settings say.
fn finished(
    pod: &PodRef,
    ending: Ending,
    record: Option<&TaskRecord>,
    settings: &Settings,
) -> Verdict {
    let keep = |why| Verdict::Keep {
        pod: pod.clone(),
        why,
    };
    if let Some(record) = record {
        if record.pod(&pod.uid).is_some_and(|p| p.state.gone) {
            return keep(Kept::Gone);
        }
        if let Some(candidate) = candidate(record, &pod.uid) {
            if candidate.terminating {
                return keep(Kept::Terminating);
            }
            if drives_a_live_try(record, candidate) {
                return keep(Kept::Drives);
            }
        }
    }
    if !settings.delete_worker_pods {
        return Verdict::MarkDone { pod: pod.clone() };
    }
    if ending == Ending::Failed && !settings.delete_worker_pods_on_failure {
        return keep(Kept::FailedKept);
    }
    Verdict::Delete {
        pod: pod.clone(),
        reason: Reason::Finished,
        resource_version: None,
        driver: None,
    }
}

/// A pod that lost to another of its task instance: deleted once the grace period is over,
/// if it still loses then.
fn loser(pod: &PodRef, record: Option<&TaskRecord>, age: Duration, settings: &Settings) -> Verdict {
    let keep = |why| Verdict::Keep {
        pod: pod.clone(),
        why,
    };
    let Some(record) = record else {
        return keep(Kept::NotACandidate);
    };
    if record.pod(&pod.uid).is_some_and(|p| p.state.gone) {
        return keep(Kept::Gone);
    }
    let Some(candidate) = candidate(record, &pod.uid) else {
        return keep(Kept::NotACandidate);
    };
    if candidate.terminating {
        return keep(Kept::Terminating);
    }
    let driver = chosen(record).map(|c| c.pod.clone());
    if driver.as_ref().is_some_and(|c| c.uid == pod.uid) {
        return keep(Kept::Drives);
    }
    late(candidate, Reason::Duplicate, driver, age, settings)
}

/// The live pods of a try that a later try superseded: deleted once the grace period is over.
fn superseded(
    record: Option<&TaskRecord>,
    by: &PodRef,
    age: Duration,
    settings: &Settings,
) -> Vec<Verdict> {
    let Some(task) = record.and_then(|r| r.task.as_ref()) else {
        return Vec::new();
    };
    task.candidates
        .iter()
        .filter(|c| is_live(c.phase))
        .map(|c| {
            if c.terminating {
                Verdict::Keep {
                    pod: c.pod.clone(),
                    why: Kept::Terminating,
                }
            } else {
                late(c, Reason::Stale, Some(by.clone()), age, settings)
            }
        })
        .collect()
}

/// The verdict on a pod collected after the grace period: a live one only when live pods
/// may be, and on its resourceVersion.
fn late(
    candidate: &Candidate,
    reason: Reason,
    driver: Option<PodRef>,
    age: Duration,
    settings: &Settings,
) -> Verdict {
    let live = is_live(candidate.phase);
    if live && !settings.live_pods {
        return match reason {
            // A loser's ending sends no new command: it is judged again until it has ended.
            Reason::Duplicate => Verdict::Wait {
                pod: candidate.pod.clone(),
                reason,
                left: if age < settings.grace {
                    settings.grace - age
                } else {
                    settings.grace
                },
            },
            Reason::Finished | Reason::Stale => Verdict::Keep {
                pod: candidate.pod.clone(),
                why: Kept::Live,
            },
        };
    }
    if age < settings.grace {
        return Verdict::Wait {
            pod: candidate.pod.clone(),
            reason,
            left: settings.grace - age,
        };
    }
    Verdict::Delete {
        pod: candidate.pod.clone(),
        reason,
        resource_version: live.then(|| candidate.resource_version.clone()),
        driver,
    }
}

/// Whether `candidate` drives a try that has not ended: the chosen pod, live, not
/// terminating, and no ending reported for it. The collector never deletes such a pod.
pub fn drives_a_live_try(record: &TaskRecord, candidate: &Candidate) -> bool {
    chosen(record).is_some_and(|c| c.pod.uid == candidate.pod.uid)
        && is_live(candidate.phase)
        && !candidate.terminating
        && !candidate.out_of_play()
}

/// The candidate of `record` that drives its task instance.
fn chosen(record: &TaskRecord) -> Option<&Candidate> {
    let task = record.task.as_ref()?;
    duplicates::choose(&task.candidates).map(|at| &task.candidates[at])
}

fn candidate<'r>(record: &'r TaskRecord, uid: &str) -> Option<&'r Candidate> {
    record.task.as_ref()?.candidate(uid)
}

fn is_live(phase: Phase) -> bool {
    matches!(phase, Phase::Pending | Phase::Running)
}

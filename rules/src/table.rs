//! The phase and deletion table of docs/semantics.md, as a pure function of one
//! event: what the pod, as it is now, says about its task instance.

use std::sync::Arc;

use podstream_proto::signature::{PodSigning, Unsigned};
use podstream_proto::v1::{ContainerTerminated, ContainerWaiting, EventType, Phase};
use podstream_proto::{FATAL_PENDING, PodEvent};

/// Waiting reasons that fail a pending pod, unless configured otherwise.
pub const DEFAULT_FATAL_REASONS: &[&str] = &[
    "CreateContainerConfigError",
    "ErrImagePull",
    "CreateContainerError",
    "ImageInspectError",
    "InvalidImageName",
];

/// The `ErrImagePull` message that is throttling, not a bad image.
const PULL_QPS_EXCEEDED: &str = "pull QPS exceeded";

/// Configuration of the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    fatal_reasons: Vec<String>,
    /// With `--require-signed-pods`: the keys a pod's signature must be made with.
    signing: Option<Arc<PodSigning>>,
}

impl Default for Rules {
    fn default() -> Self {
        Rules::with_fatal_reasons(DEFAULT_FATAL_REASONS.iter().copied())
    }
}

impl Rules {
    /// Rules with these fatal waiting reasons. Each is trimmed and empty ones
    /// dropped: Airflow's own default string once carried a leading space
    /// that silently disabled `InvalidImageName`.
    pub fn with_fatal_reasons<S: AsRef<str>>(reasons: impl IntoIterator<Item = S>) -> Self {
        let fatal_reasons = reasons
            .into_iter()
            .map(|r| r.as_ref().trim().to_owned())
            .filter(|r| !r.is_empty())
            .collect();
        Rules {
            fatal_reasons,
            signing: None,
        }
    }

    /// These rules, requiring every pod to be signed with one of `signing`'s keys: an
    /// unsigned pod is foreign and changes no task state (docs/semantics.md "Signed worker
    /// pods").
    pub fn requiring_signatures(self, signing: PodSigning) -> Self {
        Rules {
            signing: Some(Arc::new(signing)),
            ..self
        }
    }

    /// Why `event`'s pod is foreign for want of a valid signature; `None` when it is signed
    /// or signatures are not required. An event without a pod or key cannot be signed.
    pub fn unsigned(&self, event: &PodEvent) -> Option<Unsigned> {
        let signing = self.signing.as_ref()?;
        let (Some(pod), Some(task)) = (&event.pod, &event.task) else {
            return Some(Unsigned::Missing);
        };
        signing.verify(pod, task, &event.signature).err()
    }

    /// Rules from a comma-separated list, as in Airflow's
    /// `worker_pod_pending_fatal_container_state_reasons`.
    pub fn from_comma_list(list: &str) -> Self {
        Rules::with_fatal_reasons(list.split(','))
    }

    /// The configured fatal waiting reasons, trimmed.
    pub fn fatal_reasons(&self) -> &[String] {
        &self.fatal_reasons
    }

    fn is_fatal(&self, waiting: &ContainerWaiting) -> bool {
        if waiting.reason == "ErrImagePull" && waiting.message == PULL_QPS_EXCEEDED {
            return false;
        }
        self.fatal_reasons.contains(&waiting.reason)
    }

    /// What `event` says about its task instance (docs/semantics.md, rows 1–10,
    /// checked in order).
    ///
    /// ```
    /// use podstream_rules::{Ignored, Outcome, Rules};
    /// use podstream_proto::PodEvent;
    /// use podstream_proto::v1::{ContainerWaiting, EventType, Phase};
    ///
    /// let rules = Rules::default();
    /// let mut event = PodEvent::default();
    /// event.set_phase(Phase::Running);
    /// assert_eq!(rules.outcome(&event), Outcome::Running);
    ///
    /// // A DELETED without a deletion timestamp is a pod leaving the selector (a relabel),
    /// // never a deletion: seed 001.
    /// event.set_type(EventType::Deleted);
    /// assert_eq!(rules.outcome(&event), Outcome::Ignored(Ignored::LeftSelector));
    ///
    /// // A pending pod whose image cannot be pulled fails its task.
    /// let mut pending = PodEvent::default();
    /// pending.set_phase(Phase::Pending);
    /// pending.first_app_waiting = Some(ContainerWaiting {
    ///     container: "base".into(),
    ///     reason: "ErrImagePull".into(),
    ///     message: String::new(),
    /// });
    /// assert!(matches!(rules.outcome(&pending), Outcome::Fail(_)));
    /// ```
    pub fn outcome(&self, event: &PodEvent) -> Outcome {
        if let Some(reason) = self.unsigned(event) {
            return Outcome::Ignored(Ignored::Unsigned(reason));
        }
        if event.revoked {
            return Outcome::Ignored(Ignored::Revoked);
        }
        if event.executor_done {
            return Outcome::Ignored(Ignored::ExecutorDone);
        }
        let deleted = event.r#type() == EventType::Deleted;
        // A delete the ingest synthesized after a re-list is a real deletion:
        // the pod vanished while nobody watched.
        let really_deleted = deleted && (event.deletion_unix_ms.is_some() || event.synthesized);
        if deleted && !really_deleted {
            return Outcome::Ignored(Ignored::LeftSelector);
        }
        if event.status_reason == "ProviderFailed" {
            return Failure::outcome("provider_failed", "status.reason is ProviderFailed", event);
        }
        match event.phase() {
            Phase::Pending if really_deleted => Outcome::Lost {
                reason: "deleted_while_pending".to_owned(),
            },
            Phase::Pending => {
                let checked = event
                    .init_waiting
                    .iter()
                    .chain(event.first_app_waiting.as_ref());
                match checked.into_iter().find(|w| self.is_fatal(w)) {
                    Some(w) => Failure::outcome(
                        format!("{FATAL_PENDING}{}", w.reason),
                        format!(
                            "container {} waiting: {} {}",
                            w.container, w.reason, w.message
                        )
                        .trim_end(),
                        event,
                    ),
                    None => Outcome::Pending,
                }
            }
            Phase::Failed => Failure::outcome("pod_failed", exit_summary(&event.terminated), event),
            Phase::Succeeded => Outcome::Completed,
            Phase::Running if really_deleted => {
                Failure::outcome("deleted_while_running", "pod deleted while running", event)
            }
            Phase::Running => Outcome::Running,
            Phase::Unknown | Phase::Unspecified => Outcome::Ignored(Ignored::UnknownPhase),
        }
    }
}

/// What one event says about the task instance of its pod.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Outcome {
    /// The pod failed the task (shared: the state keeps it twice, as the
    /// pod's current outcome and as what was reported).
    Fail(Arc<Failure>),
    /// The pod succeeded; the task recorded its own outcome.
    Completed,
    /// The pod runs.
    Running,
    /// The pod was deleted before it started; a requeue may follow.
    Lost {
        /// `deleted_while_pending`.
        reason: String,
    },
    /// The pod waits to start, nothing fatal yet.
    Pending,
    /// The event changes no task state.
    Ignored(Ignored),
}

impl Outcome {
    /// Whether the task instance can no longer be driven by this pod after
    /// reporting this outcome.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Outcome::Fail(_) | Outcome::Completed | Outcome::Lost { .. }
        )
    }

    /// Whether this outcome is reported as a command.
    pub fn is_reported(&self) -> bool {
        matches!(
            self,
            Outcome::Fail(_) | Outcome::Completed | Outcome::Running | Outcome::Lost { .. }
        )
    }

    /// Whether two outcomes state the same fact (a fail is a fail, whatever
    /// the reason: a pod fails its task once).
    pub fn same_fact(&self, other: &Outcome) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// Why a failing pod fails its task.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Failure {
    /// `provider_failed`, `fatal_pending:<Reason>`, `pod_failed`, `deleted_while_running`.
    pub reason: String,
    /// The facts behind the reason, in words.
    pub detail: String,
    /// Terminated containers at the time.
    pub terminated: Vec<ContainerTerminated>,
}

impl Failure {
    fn outcome(reason: impl Into<String>, detail: impl Into<String>, event: &PodEvent) -> Outcome {
        Outcome::Fail(Arc::new(Failure {
            reason: reason.into(),
            detail: detail.into(),
            terminated: event.terminated.clone(),
        }))
    }
}

/// Why an event changes no task state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Ignored {
    /// Row 1: the executor revoked the pod.
    Revoked,
    /// The executor finished with the pod (`airflow_executor_done`).
    ExecutorDone,
    /// Row 2: `DELETED` without `deletionTimestamp`, the pod left a selector.
    LeftSelector,
    /// Row 10: a phase the rules do not know (`Unknown`, absent).
    UnknownPhase,
    /// Row 0, with `--require-signed-pods`: the pod carries no valid signature, so no
    /// executor launched it; why.
    Unsigned(Unsigned),
}

fn exit_summary(terminated: &[ContainerTerminated]) -> String {
    if terminated.is_empty() {
        return "pod failed; no container reported an exit".to_owned();
    }
    // Built by hand into one string: this runs for every failed pod, and
    // `write!` spent more than the rest of the core on it.
    let mut exit_code = itoa::Buffer::new();
    let mut summary = String::with_capacity(48 * terminated.len());
    for (at, t) in terminated.iter().enumerate() {
        if at > 0 {
            summary.push_str(", ");
        }
        summary.push_str(&t.container);
        summary.push_str(" exited ");
        summary.push_str(exit_code.format(t.exit_code));
        if !t.reason.is_empty() {
            summary.push_str(" (");
            summary.push_str(&t.reason);
            summary.push(')');
        }
    }
    summary
}

//! The decision: one `PodEvent` and the prior state in, the new state and the
//! commands out. Pure: no clock, no I/O, no randomness, so `podstream decide`,
//! the tests, a replay and every processor instance agree.

use std::borrow::Cow;

use podstream_proto::PodEvent;
use podstream_proto::v1::{self, EventType, PodRef, TaskKey, command::Kind};
use thiserror::Error;

use crate::command::TaskCommand;

use crate::duplicates::{choose, precedence};
use crate::order::is_newer;
use crate::state::{Candidate, PodState, Prior, TaskState};
use crate::table::{Ignored, Outcome, Rules};

/// A `PodEvent` the rules cannot decide (a malformed message on the bus).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EventError {
    /// The event names no pod uid.
    #[error("pod event has no pod uid")]
    NoPod,
    /// The event names no task instance.
    #[error("pod event has no task instance key")]
    NoTask,
    /// The task instance key is outside the bounds podstream accepts.
    #[error("task instance key out of bounds: {0}")]
    Unbounded(#[from] podstream_proto::task::Unbounded),
}

/// The result of deciding one event; its commands borrow from the event.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'e> {
    /// Not newer than the last applied event of the pod (a redelivery, a
    /// replay, a re-list): nothing changes, nothing is emitted.
    Stale {
        /// The prior state, handed back unchanged (its pod holds the
        /// resourceVersion of the last applied event).
        prior: Prior,
    },
    /// The event was applied.
    Applied(Applied<'e>),
}

/// The new state and the commands of an applied event.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied<'e> {
    /// What the event says about its TI, before duplicate resolution.
    pub outcome: Outcome,
    /// The pod's state to store.
    pub pod: PodState,
    /// The TI's state to store; `None` when no pod maps to it any more.
    pub task: Option<TaskState>,
    /// Commands, in the order they must be applied.
    pub commands: Vec<TaskCommand<'e>>,
}

/// The pod and TI key an event is about: what every event must name.
pub fn identity(event: &PodEvent) -> Result<(&PodRef, &TaskKey), EventError> {
    let pod = event
        .pod
        .as_ref()
        .filter(|p| !p.uid.is_empty())
        .ok_or(EventError::NoPod)?;
    let key = event.task.as_ref().ok_or(EventError::NoTask)?;
    Ok((pod, key))
}

/// Decides one event of one pod (docs/semantics.md, in full).
pub fn decide<'e>(
    rules: &Rules,
    event: &'e PodEvent,
    prior: Prior,
) -> Result<Decision<'e>, EventError> {
    let (pod, key) = identity(event)?;
    Ok(decide_identified(rules, event, pod, key, prior))
}

/// [`decide`] for an event whose [`identity`] the caller has already read.
///
/// The prior state is moved in and reused for the new one, so a pod's
/// strings are written in place rather than reallocated on every event.
pub fn decide_identified<'e>(
    rules: &Rules,
    event: &'e PodEvent,
    pod: &'e PodRef,
    key: &'e TaskKey,
    prior: Prior,
) -> Decision<'e> {
    if let Some(last) = &prior.pod
        && !is_newer(&event.resource_version, &last.resource_version)
    {
        return Decision::Stale { prior };
    }

    let deleted = event.r#type() == EventType::Deleted;
    let outcome = rules.outcome(event);
    let Prior {
        pod: prior_pod,
        task: prior_task,
    } = prior;
    let mut relabelled_from = None;
    let pod_state = match prior_pod {
        Some(mut state) => {
            if state.owner != event.owner {
                relabelled_from = Some(std::mem::replace(&mut state.owner, event.owner.clone()));
            }
            state.resource_version.clone_from(&event.resource_version);
            state.gone = deleted;
            state
        }
        None => PodState {
            owner: event.owner.clone(),
            resource_version: event.resource_version.clone(),
            gone: deleted,
        },
    };
    // Unsigned, revoked and done pods change no task state: only the order rule holds. An
    // unsigned pod is never a candidate, so it is never chosen and never settles a try.
    if matches!(
        outcome,
        Outcome::Ignored(Ignored::Unsigned(_) | Ignored::Revoked | Ignored::ExecutorDone)
    ) {
        return Decision::Applied(Applied {
            outcome,
            pod: pod_state,
            task: prior_task,
            commands: Vec::new(),
        });
    }
    // A retired pod (replaced by a relaunch) changes no task state either; its deletion
    // is the last the TI needs to remember of it.
    let mut task = match prior_task {
        Some(mut task) if task.retired.contains(&pod.uid) => {
            if deleted {
                task.retired.retain(|uid| *uid != pod.uid);
            }
            return Decision::Applied(Applied {
                outcome,
                pod: pod_state,
                task: task.is_remembered().then_some(task),
                commands: Vec::new(),
            });
        }
        prior_task => prior_task.unwrap_or_default(),
    };
    if is_relaunch(&task, pod, event, &outcome) {
        task.settled = false;
        let (retired, in_play) = std::mem::take(&mut task.candidates)
            .into_iter()
            .partition(Candidate::out_of_play);
        task.candidates = in_play;
        task.retired
            .extend(retired.into_iter().map(|c: Candidate| c.pod.uid));
    }
    upsert(&mut task, pod, key, event, &outcome);
    let mut commands = Vec::new();

    // A relabel is an ownership transfer, reported by the pod that drives the TI.
    if let Some(from) = relabelled_from
        && chosen_uid(&task) == Some(pod.uid.as_str())
    {
        let transfer = Kind::Transfer(v1::Transfer {
            from,
            to: event.owner.clone(),
        });
        push_sized(&mut commands, command(key, pod, event, transfer));
        forward_outcome(&task, key, event, pod, &mut commands);
    }
    report_chosen(&mut task, key, event, pod, &mut commands);
    if deleted {
        task.candidates.retain(|c| c.pod.uid != pod.uid);
        report_chosen(&mut task, key, event, pod, &mut commands);
    }
    pass_over(&mut task, pod);
    report_duplicates(&mut task, key, event, pod, &mut commands);

    let task = task.is_remembered().then_some(task);
    Decision::Applied(Applied {
        outcome,
        pod: pod_state,
        task,
        commands,
    })
}

/// A pod new to a settled try, and alive: it drives the try from then on, and the pods whose
/// ending was reported retire. After a fail or a loss this is the executor's relaunch
/// (cncf.kubernetes relaunches a pod that failed before its task started, for the same try).
/// After a completion no executor launches another pod for the try, so one of the two is a
/// copy: either the one that completed (made before the real pod was bound, say) or this one.
/// Which is the try's own only its consumer can tell (the executor knows the pods it launched,
/// the sink the pod the task runs in), so the new pod is reported rather than muted.
fn is_relaunch(task: &TaskState, pod: &PodRef, event: &PodEvent, outcome: &Outcome) -> bool {
    task.settled
        && matches!(outcome, Outcome::Pending | Outcome::Running)
        && event.deletion_unix_ms.is_none()
        && task.candidate(&pod.uid).is_none()
}

/// Marks the event's pod passed over when it ended while another pod drove the live try:
/// its ending is not the TI's, now or after the driving pod ends too. Without this, a newer
/// pod that failed early (a forged copy of the TI's annotations, say) would win the order
/// again once the real pod ended, and the real pod's outcome would never be reported.
fn pass_over(task: &mut TaskState, pod: &PodRef) {
    if task.settled {
        return;
    }
    let chosen = chosen_uid(task).map(str::to_owned);
    if let Some(candidate) = task.candidates.iter_mut().find(|c| c.pod.uid == pod.uid)
        && candidate.current.is_terminal()
        && chosen.as_deref() != Some(pod.uid.as_str())
    {
        candidate.passed_over = true;
    }
}

/// Records the event's facts in the pod's candidate entry, keeping what was
/// already reported for it.
fn upsert(task: &mut TaskState, pod: &PodRef, key: &TaskKey, event: &PodEvent, outcome: &Outcome) {
    let terminating = event.deletion_unix_ms.is_some();
    match task.candidates.iter_mut().find(|c| c.pod.uid == pod.uid) {
        Some(candidate) => {
            // In place: a known pod's strings rarely change, so this rarely allocates.
            if candidate.pod != *pod {
                candidate.pod = pod.clone();
            }
            candidate.owner.clone_from(&event.owner);
            candidate
                .resource_version
                .clone_from(&event.resource_version);
            candidate.phase = event.phase();
            candidate.terminating = terminating;
            candidate.created_unix_ms = event.creation_unix_ms;
            candidate.current = outcome.clone();
            if candidate.task_instance_id != key.task_instance_id {
                candidate.task_instance_id.clone_from(&key.task_instance_id);
            }
        }
        None => push_sized(
            &mut task.candidates,
            Candidate {
                pod: pod.clone(),
                owner: event.owner.clone(),
                resource_version: event.resource_version.clone(),
                phase: event.phase(),
                terminating,
                created_unix_ms: event.creation_unix_ms,
                current: outcome.clone(),
                reported: None,
                task_instance_id: key.task_instance_id.clone(),
                passed_over: false,
            },
        ),
    }
}

fn chosen_uid(task: &TaskState) -> Option<&str> {
    choose(&task.candidates).map(|at| task.candidates[at].pod.uid.as_str())
}

/// Reports the chosen pod's outcome, unless it was reported already or the
/// try is settled. Only the chosen pod drives the TI: a losing pod's failure
/// never fails it. When the choice moves to another pod, that pod's unreported
/// outcome is reported now, so the TI never waits on a pod that lost.
fn report_chosen<'e>(
    task: &mut TaskState,
    key: &'e TaskKey,
    event: &'e PodEvent,
    pod: &'e PodRef,
    commands: &mut Vec<TaskCommand<'e>>,
) {
    if task.settled {
        return;
    }
    let Some(at) = choose(&task.candidates) else {
        return;
    };
    let chosen = &mut task.candidates[at];
    let repeat = chosen
        .reported
        .as_ref()
        .is_some_and(|r| r.is_terminal() || r.same_fact(&chosen.current));
    if !chosen.current.is_reported() || repeat {
        return;
    }
    let Some(kind) = command_kind(&chosen.current) else {
        return;
    };
    // The event's own pod was just recorded from the event: borrow its facts.
    push_sized(
        commands,
        if chosen.pod.uid == pod.uid {
            command(key, pod, event, kind)
        } else {
            TaskCommand {
                task: key_of(key, &chosen.task_instance_id),
                pod: Cow::Owned(chosen.pod.clone()),
                owner: Cow::Owned(chosen.owner.clone()),
                resource_version: Cow::Owned(chosen.resource_version.clone()),
                kind,
            }
        },
    );
    task.settled = chosen.current.is_terminal();
    chosen.reported = Some(chosen.current.clone());
}

/// An outcome follows the task to its new owner: when the pod whose ending settled the try
/// moves to another scheduler (which adopts the task after the pod ended while its owner was
/// away), that scheduler gets the ending too, as a command of its own. Its id names this
/// event's resourceVersion, so it is never taken for the first owner's duplicate; the sink's
/// guard and the executor apply an ending once whoever hears it twice.
fn forward_outcome<'e>(
    task: &TaskState,
    key: &'e TaskKey,
    event: &'e PodEvent,
    pod: &'e PodRef,
    commands: &mut Vec<TaskCommand<'e>>,
) {
    if !task.settled {
        return;
    }
    if let Some(kind) = task
        .candidate(&pod.uid)
        .and_then(|c| c.reported.as_ref())
        .filter(|r| r.is_terminal())
        .and_then(command_kind)
    {
        push_sized(commands, command(key, pod, event, kind));
    }
}

/// The command that reports `outcome`; `None` for what is never reported (pending, ignored).
fn command_kind(outcome: &Outcome) -> Option<Kind> {
    Some(match outcome {
        Outcome::Fail(failure) => Kind::Fail(v1::Fail::new(
            failure.reason.clone(),
            failure.detail.clone(),
            failure.terminated.clone(),
        )),
        Outcome::Completed => Kind::Completed(v1::Completed {}),
        Outcome::Running => Kind::Running(v1::Running {}),
        Outcome::Lost { reason } => Kind::Lost(v1::Lost {
            reason: reason.clone(),
        }),
        Outcome::Pending | Outcome::Ignored(_) => return None,
    })
}

/// The most other pods a duplicate record names (the most preferred): thousands of copies of
/// a pod must not make a command past the server's `max_payload`.
pub const MAX_DUPLICATE_OTHERS: usize = 32;

/// Emits a duplicate record when the set of pods of the TI (as far as it names them), or the
/// chosen one, differs from the last record.
fn report_duplicates<'e>(
    task: &mut TaskState,
    key: &'e TaskKey,
    event: &'e PodEvent,
    pod: &'e PodRef,
    commands: &mut Vec<TaskCommand<'e>>,
) {
    let Some(at) = choose(&task.candidates).filter(|_| task.candidates.len() > 1) else {
        task.duplicate_reported = None;
        return;
    };
    let chosen = &task.candidates[at];
    let mut others: Vec<&Candidate> = task
        .candidates
        .iter()
        .filter(|c| c.pod.uid != chosen.pod.uid)
        .collect();
    others.sort_by(|a, b| precedence(a, b));
    let left_out = others.len().saturating_sub(MAX_DUPLICATE_OTHERS);
    others.truncate(MAX_DUPLICATE_OTHERS);
    let mut signature: Vec<String> = others.iter().map(|c| c.pod.uid.clone()).collect();
    signature.sort();
    signature.insert(0, chosen.pod.uid.clone());
    if task.duplicate_reported.as_ref() == Some(&signature) {
        return;
    }
    let duplicate = Kind::Duplicate(v1::Duplicate {
        chosen: Some(chosen.pod.clone()),
        others: others.iter().map(|c| c.pod.clone()).collect(),
        basis: v1::DuplicateBasis::PodOrder as i32,
        others_left_out: u32::try_from(left_out).unwrap_or(u32::MAX),
    });
    push_sized(commands, command(key, pod, event, duplicate));
    task.duplicate_reported = Some(signature);
}

/// Pushes onto a vector that nearly always ends up holding one item: the
/// first push makes room for one, not the usual four (four commands or
/// candidates are near 1 KiB, past the allocator's small-object classes).
fn push_sized<T>(items: &mut Vec<T>, item: T) {
    if items.capacity() == 0 {
        items.reserve_exact(1);
    }
    items.push(item);
}

/// The event's TI key with the UUID of the pod a command reports for: pods of one key share
/// a record whatever UUID they name, and the sink checks each command's UUID against the TI.
fn key_of<'e>(key: &'e TaskKey, task_instance_id: &str) -> Cow<'e, TaskKey> {
    if key.task_instance_id == task_instance_id {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(TaskKey {
            task_instance_id: task_instance_id.to_owned(),
            ..key.clone()
        })
    }
}

/// A command about the event's own pod, borrowing its facts from the event.
fn command<'e>(
    key: &'e TaskKey,
    pod: &'e PodRef,
    event: &'e PodEvent,
    kind: Kind,
) -> TaskCommand<'e> {
    TaskCommand {
        task: Cow::Borrowed(key),
        pod: Cow::Borrowed(pod),
        owner: Cow::Borrowed(&event.owner),
        resource_version: Cow::Borrowed(&event.resource_version),
        kind,
    }
}

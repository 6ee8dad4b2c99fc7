//! The guard: what a command may do to a task instance, as a pure function of the command and
//! the TI row. Table-tested in `tests/guard.rs`.

use std::collections::BTreeSet;

use podstream_proto::Command;
use podstream_proto::v1::command::Kind;

/// States a TI can be adopted from: only these move.
pub const ADOPTABLE: [&str; 3] = ["queued", "running", "restarting"];

/// States that end a try.
pub const TERMINAL: [&str; 5] = ["success", "failed", "skipped", "upstream_failed", "removed"];

/// `[kubernetes_executor] pod_launch_failure_excluded_container_reasons` as Airflow ships it:
/// a container that ended with `Error` started the worker, so its failure is the task's.
pub const DEFAULT_LAUNCH_FAILURE_EXCLUDED_REASONS: &str = "Error";

/// Who moves a task instance to `up_for_retry` or `failed` when its pod fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskFailures {
    /// The sink: the schedulers run the stock executor, which cannot tell a relabel from a
    /// deletion; podstream's decision is written to the TI.
    #[default]
    Sink,
    /// The schedulers' executors (`PodstreamKubernetesExecutor`), which take podstream's
    /// commands and run Airflow's own handling (retries, callbacks, relaunches): the sink
    /// records each fail and leaves the TI to them, so no failure is applied twice.
    Executor,
}

impl TaskFailures {
    /// The name, as flags and consumer metadata spell it.
    pub fn name(self) -> &'static str {
        match self {
            TaskFailures::Sink => "sink",
            TaskFailures::Executor => "executor",
        }
    }
}

/// The settings the guard applies beside the TI row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Container reasons for which a failed pod of a `queued` TI fails the TI at once rather
    /// than being left to the executor's relaunch (`pod_launch_failure_excluded_container_reasons`).
    pub launch_failure_excluded_reasons: BTreeSet<String>,
    /// Who fails task instances.
    pub task_failures: TaskFailures,
}

impl Policy {
    /// A policy with `list` (comma-separated, each name trimmed, as Airflow reads its option)
    /// as the excluded container reasons.
    pub fn with_launch_failure_excluded_reasons(list: &str) -> Policy {
        Policy {
            launch_failure_excluded_reasons: list
                .split(',')
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .map(str::to_owned)
                .collect(),
            task_failures: TaskFailures::default(),
        }
    }

    /// This policy with `task_failures`.
    pub fn with_task_failures(self, task_failures: TaskFailures) -> Policy {
        Policy {
            task_failures,
            ..self
        }
    }
}

impl Default for Policy {
    fn default() -> Policy {
        Policy::with_launch_failure_excluded_reasons(DEFAULT_LAUNCH_FAILURE_EXCLUDED_REASONS)
    }
}

/// The TI columns the guard reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiRow {
    /// `state` (NULL is Airflow's "none").
    pub state: Option<String>,
    /// `try_number`.
    pub try_number: i64,
    /// `max_tries`.
    pub max_tries: i64,
    /// `id` (Airflow 3's UUID, lowercase and hyphenated); `None` on Airflow 2.
    pub id: Option<String>,
    /// The commands-stream sequence of the last transfer podstream applied to the TI.
    pub last_transfer: Option<u64>,
}

/// Why a command leaves the TI alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// No TI has this key.
    UnknownTi,
    /// The TI has finished.
    Terminal(String),
    /// The TI has moved on to a later try.
    NewerTry,
    /// The TI is at an earlier try than the command (the try has not started in Airflow).
    OlderTry,
    /// The pod names a TI UUID that is not this TI's: it belongs to another attempt.
    OtherInstance,
    /// The TI is in a state podstream does not adopt from (scheduled, up_for_retry, ...).
    NotAdoptable(String),
    /// This command was applied before.
    AlreadyApplied,
    /// A later transfer of the TI was applied already: this one was delivered late (a
    /// redelivery after a crash, another sink), and must not undo the newer owner.
    OlderTransfer,
}

impl Skip {
    /// The reason as counted in summaries: `unknown_ti`, `terminal`, `newer_try`, ...
    pub fn name(&self) -> &'static str {
        match self {
            Skip::UnknownTi => "unknown_ti",
            Skip::Terminal(_) => "terminal",
            Skip::NewerTry => "newer_try",
            Skip::OlderTry => "older_try",
            Skip::OtherInstance => "other_instance",
            Skip::NotAdoptable(_) => "not_adoptable",
            Skip::AlreadyApplied => "already_applied",
            Skip::OlderTransfer => "older_transfer",
        }
    }
}

/// The state a fail moves a TI to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailState {
    /// Retries are left.
    UpForRetry,
    /// No retries are left.
    Failed,
}

impl FailState {
    /// Airflow's name of the state, as written to `task_instance.state`.
    pub fn name(self) -> &'static str {
        match self {
            FailState::UpForRetry => "up_for_retry",
            FailState::Failed => "failed",
        }
    }
}

/// What applying a command does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// `state` := `up_for_retry` or `failed`, with `end_date`, `duration` and a `log` row.
    Fail {
        /// The new state.
        state: FailState,
    },
    /// The pod of a `queued` TI failed before the task process started: a `log` row, and the
    /// TI is left to the executor, which relaunches it without spending a retry.
    LaunchFailed,
    /// The schedulers' executors fail TIs ([`TaskFailures::Executor`]): a `log` row only.
    LeftToExecutor,
    /// `queued_by_job_id` and `external_executor_id` := the new owner.
    Transfer {
        /// The new owner as a job id.
        job_id: i64,
    },
    /// No TI change; podstream's own tables record the pod (and duplicates).
    Record,
}

impl Effect {
    /// The effect as counted and recorded: `up_for_retry`, `failed`, `launch_failed`,
    /// `left_to_executor`, `transfer`, `recorded`.
    pub fn name(&self) -> &'static str {
        match self {
            Effect::Fail { state } => state.name(),
            Effect::LaunchFailed => "launch_failed",
            Effect::LeftToExecutor => "left_to_executor",
            Effect::Transfer { .. } => "transfer",
            Effect::Record => "recorded",
        }
    }
}

/// The guard's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Apply this effect.
    Apply(Effect),
    /// Leave the TI alone, for this reason.
    Skip(Skip),
    /// The command cannot be applied at all (bad data): it goes to the dead letters.
    Invalid(String),
}

/// What `command`, at commands-stream `sequence` when it came from the bus, may do to the TI
/// `row` (`None` when no TI has its key), under `policy`.
pub fn verdict(
    command: &Command,
    sequence: Option<u64>,
    row: Option<&TiRow>,
    policy: &Policy,
) -> Verdict {
    let Some(task) = &command.task else {
        return Verdict::Invalid("command without a task instance key".into());
    };
    let Some(kind) = &command.kind else {
        return Verdict::Invalid("command without a kind".into());
    };
    let Some(row) = row else {
        return Verdict::Skip(Skip::UnknownTi);
    };
    if row.try_number > task.try_number {
        return Verdict::Skip(Skip::NewerTry);
    }
    if row.try_number < task.try_number {
        return Verdict::Skip(Skip::OlderTry);
    }
    if let Some(id) = &row.id
        && !task.task_instance_id.is_empty()
        && *id != task.task_instance_id
    {
        return Verdict::Skip(Skip::OtherInstance);
    }
    let state = row.state.clone().unwrap_or_else(|| "none".to_owned());
    if TERMINAL.contains(&state.as_str()) {
        return Verdict::Skip(Skip::Terminal(state));
    }
    if !ADOPTABLE.contains(&state.as_str()) {
        return Verdict::Skip(Skip::NotAdoptable(state));
    }
    match kind {
        Kind::Fail(_) if policy.task_failures == TaskFailures::Executor => {
            Verdict::Apply(Effect::LeftToExecutor)
        }
        Kind::Fail(fail) => {
            let excluded = fail
                .provider_container_reason()
                .is_some_and(|r| policy.launch_failure_excluded_reasons.contains(r));
            if state == "queued" && !excluded {
                return Verdict::Apply(Effect::LaunchFailed);
            }
            let retries_left = row.max_tries > 0 && row.try_number <= row.max_tries;
            Verdict::Apply(Effect::Fail {
                state: if retries_left {
                    FailState::UpForRetry
                } else {
                    FailState::Failed
                },
            })
        }
        Kind::Transfer(transfer) => match transfer.to.parse::<i64>() {
            Ok(_)
                if sequence
                    .zip(row.last_transfer)
                    .is_some_and(|(this, last)| this < last) =>
            {
                Verdict::Skip(Skip::OlderTransfer)
            }
            Ok(job_id) => Verdict::Apply(Effect::Transfer { job_id }),
            Err(_) => Verdict::Invalid(format!(
                "transfer to owner {:?}: queued_by_job_id needs an integer job id",
                transfer.to
            )),
        },
        Kind::Completed(_) | Kind::Running(_) | Kind::Lost(_) | Kind::Duplicate(_) => {
            Verdict::Apply(Effect::Record)
        }
    }
}

//! The guard: what a command may do to a task instance, as a pure function of the command and
//! the TI row. Table-tested in `tests/guard.rs`.

use std::collections::BTreeSet;

use podstream_proto::v1::command::Kind;
use podstream_proto::{Command, PodRef};

/// States a TI can be adopted from: only these move.
pub const ADOPTABLE: [&str; 3] = ["queued", "running", "restarting"];

/// States that end a try.
pub const TERMINAL: [&str; 5] = ["success", "failed", "skipped", "upstream_failed", "removed"];

/// `[kubernetes_executor] pod_launch_failure_excluded_container_reasons` as Airflow ships it:
/// a container that ended with `Error` started the worker, so its failure is the task's.
pub const DEFAULT_LAUNCH_FAILURE_EXCLUDED_REASONS: &str = "Error";

/// The `last_command` values of `podstream_ti_pod` that say its pod lives on (the try stays
/// bound to it): what the sink's statements and podstream-airflow's adoption read as alive.
pub const LIVE_POD_COMMANDS: [&str; 2] = ["running", "transfer"];

/// [`LIVE_POD_COMMANDS`] as an SQL list: `('running', 'transfer')`.
pub fn live_pod_commands_sql() -> String {
    format!("('{}')", LIVE_POD_COMMANDS.join("', '"))
}

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
    /// On Airflow 3, a pod that names no `task_instance_id` is foreign to every TI. Only for
    /// an Airflow whose executor writes that annotation: the supported releases' executors
    /// (3.0 to 3.3, cncf.kubernetes 10.25) key task instances by name and write none.
    pub require_task_instance_id: bool,
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
            require_task_instance_id: false,
        }
    }

    /// This policy, requiring (or not) that an Airflow 3 TI's pods name its UUID.
    pub fn requiring_task_instance_id(self, required: bool) -> Policy {
        Policy {
            require_task_instance_id: required,
            ..self
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
    /// `hostname`: where the task process runs; a KubernetesExecutor task's is its pod's name.
    pub hostname: Option<String>,
    /// The pod podstream recorded for this try (`podstream_ti_pod`): the first that ran,
    /// while it lives.
    pub recorded_pod: Option<RecordedPod>,
}

/// A pod by namespace and name, as `podstream_ti_pod` records a try's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedPod {
    /// `pod_namespace`.
    pub namespace: String,
    /// `pod_name`.
    pub name: String,
    /// Whether it lives on (`last_command` is `running` or `transfer`): the try stays bound
    /// to it until it ends.
    pub alive: bool,
}

impl RecordedPod {
    /// The record of `pod`, alive.
    pub fn of(pod: &PodRef) -> RecordedPod {
        RecordedPod {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            alive: true,
        }
    }

    /// Whether `pod` is this one: same namespace and name (a pod of the same name in another
    /// namespace is another pod).
    pub fn is(&self, pod: Option<&PodRef>) -> bool {
        pod.is_some_and(|pod| pod.namespace == self.namespace && pod.name == self.name)
    }
}

impl TiRow {
    /// A row in `state` at `try_number` of `max_tries`, with no id, hostname or podstream
    /// history.
    pub fn new(state: Option<&str>, try_number: i64, max_tries: i64) -> TiRow {
        TiRow {
            state: state.map(str::to_owned),
            try_number,
            max_tries,
            id: None,
            last_transfer: None,
            hostname: None,
            recorded_pod: None,
        }
    }

    /// The pod the running task lives in, when podstream knows it: the TI is `running` and its
    /// `hostname` names the pod podstream recorded for the try.
    fn bound_pod(&self) -> Option<&RecordedPod> {
        let hostname = self.hostname.as_deref().filter(|h| !h.is_empty())?;
        let recorded = self.recorded_pod.as_ref()?;
        (self.state.as_deref() == Some("running") && recorded.name == hostname).then_some(recorded)
    }
}

/// Whether the pod of `command` is foreign to the TI `row` (semantics: a pod acts only on its
/// own task instance): an Airflow 3 row belongs to no pod that names another UUID (nor, when
/// `require_task_instance_id`, to one that names none), an Airflow 2 row to no pod that names
/// one, and a running TI whose hostname names the pod podstream recorded for it to that pod
/// alone.
///
/// ```
/// use podstream_proto::{Command, TaskKey};
/// use podstream_sink::guard::{TiRow, is_foreign};
/// let claiming = |id: &str| Command {
///     task: Some(TaskKey { task_instance_id: id.into(), ..TaskKey::default() }),
///     ..Command::default()
/// };
/// let airflow_2 = TiRow::new(Some("running"), 1, 1);
/// assert!(is_foreign(&claiming("0196b3a0-0000-7000-8000-000000000001"), &airflow_2, false));
/// assert!(!is_foreign(&claiming(""), &airflow_2, false));
/// ```
pub fn is_foreign(command: &Command, row: &TiRow, require_task_instance_id: bool) -> bool {
    let claimed = command
        .task
        .as_ref()
        .map_or("", |task| task.task_instance_id.as_str());
    let uuid_mismatch = match &row.id {
        Some(_) if claimed.is_empty() => require_task_instance_id,
        Some(id) => claimed != id,
        None => !claimed.is_empty(),
    };
    uuid_mismatch
        || row
            .bound_pod()
            .is_some_and(|bound| !bound.is(command.pod.as_ref()))
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
    /// The pod is not this TI's (another UUID, a UUID where the TI has none, none where it has
    /// one, or not the pod the running task lives in): it changes nothing.
    ForeignPod,
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
            Skip::ForeignPod => "foreign_pod",
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
///
/// ```
/// use podstream_proto::v1::Running;
/// use podstream_proto::v1::command::Kind;
/// use podstream_proto::{Command, TaskKey};
/// use podstream_sink::guard::{Policy, Skip, TiRow, Verdict, verdict};
///
/// let task = TaskKey {
///     dag_id: "etl".into(),
///     task_id: "load".into(),
///     run_id: "manual__2026-11-30".into(),
///     map_index: -1,
///     try_number: 1,
///     ..Default::default()
/// };
/// let command = Command {
///     task: Some(task),
///     kind: Some(Kind::Running(Running {})),
///     ..Default::default()
/// };
/// let policy = Policy::with_launch_failure_excluded_reasons("Error");
/// // No task instance has the key: nothing to move.
/// assert_eq!(verdict(&command, None, None, &policy), Verdict::Skip(Skip::UnknownTi));
/// // The task instance has moved on to try 2: news of try 1 is stale.
/// let row = TiRow::new(Some("running"), 2, 3);
/// assert_eq!(verdict(&command, None, Some(&row), &policy), Verdict::Skip(Skip::NewerTry));
/// ```
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
    if is_foreign(command, row, policy.require_task_instance_id) {
        return Verdict::Skip(Skip::ForeignPod);
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
            // A queued TI fails at once only from the pod bound to its try (the first that
            // ran): a copy made while the real pod waits cannot fail it.
            let bound = row
                .recorded_pod
                .as_ref()
                .is_some_and(|recorded| recorded.is(command.pod.as_ref()));
            if state == "queued" && !(excluded && bound) {
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
        // The owner moves with the try's bound pod only: another pod of the try, relabelled
        // while the bound one lives, moves nothing.
        Kind::Transfer(_)
            if row
                .recorded_pod
                .as_ref()
                .is_some_and(|bound| bound.alive && !bound.is(command.pod.as_ref())) =>
        {
            Verdict::Skip(Skip::ForeignPod)
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

//! The guard: what a command may do to a task instance, as a pure function of the command and
//! the TI row. Table-tested in `tests/guard.rs`.

use podstream_proto::Command;
use podstream_proto::v1::command::Kind;

/// States a TI can be adopted from: only these move.
pub const ADOPTABLE: [&str; 3] = ["queued", "running", "restarting"];

/// States that end a try.
pub const TERMINAL: [&str; 5] = ["success", "failed", "skipped", "upstream_failed", "removed"];

/// The TI columns the guard reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiRow {
    /// `state` (NULL is Airflow's "none").
    pub state: Option<String>,
    /// `try_number`.
    pub try_number: i64,
    /// `max_tries`.
    pub max_tries: i64,
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
    /// The TI is in a state podstream does not adopt from (scheduled, up_for_retry, ...).
    NotAdoptable(String),
    /// This command was applied before.
    AlreadyApplied,
}

impl Skip {
    /// The reason as counted in summaries: `unknown_ti`, `terminal`, `newer_try`, ...
    pub fn name(&self) -> &'static str {
        match self {
            Skip::UnknownTi => "unknown_ti",
            Skip::Terminal(_) => "terminal",
            Skip::NewerTry => "newer_try",
            Skip::OlderTry => "older_try",
            Skip::NotAdoptable(_) => "not_adoptable",
            Skip::AlreadyApplied => "already_applied",
        }
    }
}

/// What applying a command does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// `state` := `up_for_retry` or `failed`, with `end_date`, `duration` and a `log` row.
    Fail {
        /// The new state.
        state: &'static str,
    },
    /// `queued_by_job_id` and `external_executor_id` := the new owner.
    Transfer {
        /// The new owner as a job id.
        job_id: i64,
    },
    /// No TI change; podstream's own tables record the pod (and duplicates).
    Record,
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

/// What `command` may do to the TI `row` (`None` when no TI has its key).
pub fn verdict(command: &Command, row: Option<&TiRow>) -> Verdict {
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
    let state = row.state.clone().unwrap_or_else(|| "none".to_owned());
    if TERMINAL.contains(&state.as_str()) {
        return Verdict::Skip(Skip::Terminal(state));
    }
    if !ADOPTABLE.contains(&state.as_str()) {
        return Verdict::Skip(Skip::NotAdoptable(state));
    }
    match kind {
        Kind::Fail(_) => {
            let retries_left = row.max_tries > 0 && row.try_number <= row.max_tries;
            Verdict::Apply(Effect::Fail {
                state: if retries_left {
                    "up_for_retry"
                } else {
                    "failed"
                },
            })
        }
        Kind::Transfer(transfer) => match transfer.to.parse::<i64>() {
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

//! The task instance key and the pod reference: display, identity and the
//! command idempotency id.

use std::fmt;

use thiserror::Error;

use crate::v1::{ContainerTerminated, Fail, PodRef, TaskKey, command};

/// The prefix of a fail's reason when a container waits for good: `fatal_pending:<Reason>`.
pub const FATAL_PENDING: &str = "fatal_pending:";

/// Airflow's own limit on `dag_id`, `task_id` and `run_id` (`ID_LEN`), in characters: a
/// longer one names no task instance.
pub const MAX_ID_CHARS: usize = 250;

/// The most bytes the escaped names of a TI key (`dag_id`, `task_id`, the run) may take
/// together in a KV key: well under nats-server's 4,096-byte control line, which a longer
/// key breaks (the server closes the connection that every other TI's work shares).
pub const MAX_KEY_TOKEN_BYTES: usize = 1536;

/// Why a TI key is outside the bounds podstream accepts (semantics: bounded input).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unbounded {
    /// A name is longer than Airflow allows.
    #[error("`{field}` is {chars} characters, over Airflow's limit of {MAX_ID_CHARS}")]
    TooLong {
        /// Which name.
        field: &'static str,
        /// Its length in characters.
        chars: usize,
    },
    /// A name holds a control character (a terminal escape, a newline).
    #[error("`{field}` holds a control character")]
    ControlCharacter {
        /// Which name.
        field: &'static str,
    },
    /// The names, escaped for a KV key, are too long together.
    #[error("the task instance key takes {bytes} bytes escaped, over {MAX_KEY_TOKEN_BYTES}")]
    KeyTooLong {
        /// Their escaped length.
        bytes: usize,
    },
}

impl TaskKey {
    /// Whether the key names its DAG run; pods older than run ids carry only
    /// a logical date, which the sink resolves.
    pub fn is_complete(&self) -> bool {
        !self.run_id.is_empty()
    }

    /// Checks the key's names against Airflow's limits and the bus's: each at most
    /// [`MAX_ID_CHARS`] characters and free of control characters, and all of them, escaped
    /// for a KV key, at most [`MAX_KEY_TOKEN_BYTES`].
    ///
    /// ```
    /// use podstream_proto::TaskKey;
    /// let mut key = TaskKey { dag_id: "etl".into(), task_id: "load".into(), run_id: "r1".into(), ..TaskKey::default() };
    /// assert!(key.check_bounds().is_ok());
    /// key.dag_id = "x".repeat(251);
    /// assert!(key.check_bounds().is_err());
    /// ```
    pub fn check_bounds(&self) -> Result<(), Unbounded> {
        let names = [
            ("dag_id", &self.dag_id),
            ("task_id", &self.task_id),
            ("run_id", &self.run_id),
            ("logical_date", &self.logical_date),
        ];
        let mut escaped = 0;
        for (field, value) in names {
            let chars = value.chars().count();
            if chars > MAX_ID_CHARS {
                return Err(Unbounded::TooLong { field, chars });
            }
            if value.chars().any(char::is_control) {
                return Err(Unbounded::ControlCharacter { field });
            }
            escaped += crate::subject::escaped_len(value);
        }
        if escaped > MAX_KEY_TOKEN_BYTES {
            return Err(Unbounded::KeyTooLong { bytes: escaped });
        }
        Ok(())
    }
}

impl Fail {
    /// A fail with `container_reason` filled in from the other fields.
    pub fn new(reason: String, detail: String, terminated: Vec<ContainerTerminated>) -> Fail {
        let mut fail = Fail {
            reason,
            detail,
            terminated,
            container_reason: String::new(),
        };
        fail.container_reason = fail
            .provider_container_reason()
            .unwrap_or_default()
            .to_owned();
        fail
    }

    /// The container reason as the cncf.kubernetes provider reads it: the first container
    /// (init containers first) that ended with a non-zero exit code other than `Completed`;
    /// else the waiting reason behind a `fatal_pending:<Reason>`.
    pub fn provider_container_reason(&self) -> Option<&str> {
        self.terminated
            .iter()
            .find(|c| c.exit_code != 0 && c.reason != "Completed")
            .map(|c| c.reason.as_str())
            .or_else(|| self.reason.strip_prefix(FATAL_PENDING))
            .filter(|reason| !reason.is_empty())
    }
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = if self.is_complete() {
            &self.run_id
        } else {
            &self.logical_date
        };
        write!(f, "{}/{}/{}", self.dag_id, self.task_id, run)?;
        if self.map_index >= 0 {
            write!(f, "[{}]", self.map_index)?;
        }
        write!(f, "#{}", self.try_number)
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl command::Kind {
    /// The kind's name as `podstream decide` writes it (docs/contract.md §1).
    pub fn name(&self) -> &'static str {
        match self {
            command::Kind::Fail(_) => "fail",
            command::Kind::Completed(_) => "completed",
            command::Kind::Running(_) => "running",
            command::Kind::Lost(_) => "lost",
            command::Kind::Transfer(_) => "transfer",
            command::Kind::Duplicate(_) => "duplicate",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(run_id: &str, map_index: i64) -> TaskKey {
        TaskKey {
            dag_id: "etl".into(),
            task_id: "load".into(),
            run_id: run_id.into(),
            map_index,
            try_number: 2,
            logical_date: if run_id.is_empty() {
                "2024-01-01T00:00:00+00:00".into()
            } else {
                String::new()
            },
            task_instance_id: String::new(),
        }
    }

    #[test]
    fn display_names_run_map_index_and_try() {
        assert_eq!(key("manual__1", -1).to_string(), "etl/load/manual__1#2");
        assert_eq!(key("manual__1", 3).to_string(), "etl/load/manual__1[3]#2");
        assert_eq!(
            key("", -1).to_string(),
            "etl/load/2024-01-01T00:00:00+00:00#2"
        );
    }

    #[test]
    fn the_container_reason_is_read_as_the_provider_reads_it() {
        let ended = |container: &str, exit_code, reason: &str| ContainerTerminated {
            container: container.into(),
            exit_code,
            reason: reason.into(),
        };
        let cases = [
            (
                "pod_failed",
                vec![
                    ended("init", 0, "Completed"),
                    ended("base", 137, "OOMKilled"),
                ],
                "OOMKilled",
            ),
            (
                "pod_failed",
                vec![ended("init", 2, "Error"), ended("base", 1, "OOMKilled")],
                "Error",
            ),
            ("pod_failed", vec![ended("base", 0, "Completed")], ""),
            ("fatal_pending:ErrImagePull", vec![], "ErrImagePull"),
            ("deleted_while_running", vec![], ""),
        ];
        for (reason, terminated, want) in cases {
            let fail = Fail::new(reason.into(), String::new(), terminated);
            assert_eq!(fail.container_reason, want, "{reason}");
            assert_eq!(fail.provider_container_reason().unwrap_or_default(), want);
        }
    }

    #[test]
    fn completeness_follows_run_id() {
        assert!(key("r", -1).is_complete());
        assert!(!key("", -1).is_complete());
    }
}

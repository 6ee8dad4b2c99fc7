//! The task instance key and the pod reference: display, identity and the
//! command idempotency id.

use std::fmt;

use crate::v1::{ContainerTerminated, Fail, PodRef, TaskKey, command};

/// The prefix of a fail's reason when a container waits for good: `fatal_pending:<Reason>`.
pub const FATAL_PENDING: &str = "fatal_pending:";

impl TaskKey {
    /// Whether the key names its DAG run; pods older than run ids carry only
    /// a logical date, which the sink resolves.
    pub fn is_complete(&self) -> bool {
        !self.run_id.is_empty()
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
    /// The kind's name as `podstream decide` writes it (contract.md §1).
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

/// The idempotency id of the command of `kind` decided from one pod event.
///
/// One event yields at most one command of each kind, so pod uid,
/// resourceVersion and kind name identify it; deciding the same event again
/// (a replay, a second processor) gives the same id, which makes it usable as
/// `Nats-Msg-Id` and as the sink's applied-position key.
pub fn command_id(pod_uid: &str, resource_version: &str, kind: &str) -> String {
    // Built by hand: one allocation, no formatting machinery (one id per command).
    let mut id = String::with_capacity(pod_uid.len() + resource_version.len() + kind.len() + 2);
    id.push_str(pod_uid);
    id.push(':');
    id.push_str(resource_version);
    id.push(':');
    id.push_str(kind);
    id
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

    #[test]
    fn command_id_is_deterministic_and_kind_specific() {
        assert_eq!(
            command_id("u1", "42", "fail"),
            command_id("u1", "42", "fail")
        );
        assert_ne!(
            command_id("u1", "42", "fail"),
            command_id("u1", "42", "transfer")
        );
        assert_ne!(
            command_id("u1", "42", "fail"),
            command_id("u1", "43", "fail")
        );
    }
}

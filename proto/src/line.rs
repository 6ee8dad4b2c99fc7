//! The JSON line form of a command: what `podstream decide` writes and
//! `podstream apply` reads (docs/contract.md §1). Field names and values are fixed;
//! extra fields are allowed.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::v1::{self, Command, ContainerTerminated, PodRef, TaskKey, command::Kind};

/// The `kind` of a line: a command's kind, or `invalid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LineKind {
    /// A `fail` command.
    Fail,
    /// A `completed` command.
    Completed,
    /// A `running` command.
    Running,
    /// A `lost` command.
    Lost,
    /// A `transfer` command.
    Transfer,
    /// A `duplicate` record.
    Duplicate,
    /// Input that is not JSON, not a pod, or not usable: a report, not a command.
    #[default]
    Invalid,
}

impl LineKind {
    /// The kind as it is written on the line.
    pub fn as_str(self) -> &'static str {
        match self {
            LineKind::Fail => "fail",
            LineKind::Completed => "completed",
            LineKind::Running => "running",
            LineKind::Lost => "lost",
            LineKind::Transfer => "transfer",
            LineKind::Duplicate => "duplicate",
            LineKind::Invalid => "invalid",
        }
    }
}

impl From<&Kind> for LineKind {
    fn from(kind: &Kind) -> Self {
        match kind {
            Kind::Fail(_) => LineKind::Fail,
            Kind::Completed(_) => LineKind::Completed,
            Kind::Running(_) => LineKind::Running,
            Kind::Lost(_) => LineKind::Lost,
            Kind::Transfer(_) => LineKind::Transfer,
            Kind::Duplicate(_) => LineKind::Duplicate,
        }
    }
}

impl std::fmt::Display for LineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One output line of `podstream decide`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CommandLine {
    /// What the line is: a command's kind, or `invalid`.
    pub kind: LineKind,
    /// The task instance, from the pod's annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ti: Option<TaskKey>,
    /// The pod the event was about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The `airflow-worker` label value now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Why, for `fail` and `lost`; for a `duplicate` of Spark drivers, what chose the
    /// driver (`spark_application` or `spark_pod_facts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Previous owner, for `transfer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// New owner, for `transfer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The pod that drives the TI, for `duplicate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen: Option<PodRef>,
    /// The other pods of the TI, for `duplicate` (at most 32, the most preferred).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others: Option<Vec<PodRef>>,
    /// How many other pods `others` leaves out, for `duplicate`; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others_left_out: Option<u32>,
    /// What was wrong, for `invalid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Extra: the command's idempotency id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Extra: resourceVersion of the event that produced the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Extra: human-readable facts behind a `fail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Extra: terminated containers behind a `fail`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<ContainerTerminated>>,
}

/// A line that does not describe a command.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LineError {
    /// The line is an `invalid` report, not a command.
    #[error("an invalid line is a report, not a command: {0}")]
    Invalid(String),
    /// A field holds a value its kind does not know.
    #[error("the field {field:?} does not know {value:?}")]
    Unknown {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// A field the kind requires is absent.
    #[error("a {kind} line needs the field {field:?}")]
    Missing {
        /// The line's kind.
        kind: &'static str,
        /// The absent field.
        field: &'static str,
    },
}

impl CommandLine {
    /// An `invalid` line: input that is not JSON, not a pod, or not usable.
    pub fn invalid(error: impl Into<String>, pod: Option<PodRef>) -> Self {
        CommandLine {
            kind: LineKind::Invalid,
            pod,
            error: Some(error.into()),
            ..CommandLine::default()
        }
    }
}

impl From<&Command> for CommandLine {
    fn from(command: &Command) -> Self {
        let mut line = CommandLine {
            kind: command
                .kind
                .as_ref()
                .map_or(LineKind::Invalid, LineKind::from),
            ti: command.task.clone(),
            pod: command.pod.clone(),
            owner: Some(command.owner.clone()),
            id: Some(command.id.clone()),
            resource_version: Some(command.resource_version.clone()),
            ..CommandLine::default()
        };
        match &command.kind {
            Some(Kind::Fail(fail)) => {
                line.reason = Some(fail.reason.clone());
                line.detail = (!fail.detail.is_empty()).then(|| fail.detail.clone());
                line.containers = (!fail.terminated.is_empty()).then(|| fail.terminated.clone());
            }
            Some(Kind::Lost(lost)) => line.reason = Some(lost.reason.clone()),
            Some(Kind::Transfer(transfer)) => {
                line.from = Some(transfer.from.clone());
                line.to = Some(transfer.to.clone());
            }
            Some(Kind::Duplicate(duplicate)) => {
                line.chosen = duplicate.chosen.clone();
                line.others = Some(duplicate.others.clone());
                line.others_left_out =
                    (duplicate.others_left_out > 0).then_some(duplicate.others_left_out);
                line.reason = basis_name(duplicate.basis()).map(str::to_owned);
            }
            Some(Kind::Completed(_) | Kind::Running(_)) => {}
            None => line.error = Some("command without a kind".to_owned()),
        }
        line
    }
}

/// A duplicate's basis as its line's `reason`; none for worker pods (docs/semantics.md's order).
fn basis_name(basis: v1::DuplicateBasis) -> Option<&'static str> {
    match basis {
        v1::DuplicateBasis::PodOrder => None,
        v1::DuplicateBasis::SparkApplication => Some("spark_application"),
        v1::DuplicateBasis::SparkPodFacts => Some("spark_pod_facts"),
    }
}

/// The basis a duplicate line's `reason` names.
fn basis_named(reason: Option<&str>) -> Result<v1::DuplicateBasis, LineError> {
    [
        v1::DuplicateBasis::PodOrder,
        v1::DuplicateBasis::SparkApplication,
        v1::DuplicateBasis::SparkPodFacts,
    ]
    .into_iter()
    .find(|basis| basis_name(*basis) == reason)
    .ok_or(LineError::Unknown {
        field: "reason",
        value: reason.unwrap_or_default().to_owned(),
    })
}

impl TryFrom<CommandLine> for Command {
    type Error = LineError;

    fn try_from(line: CommandLine) -> Result<Self, LineError> {
        fn need<T>(
            value: Option<T>,
            kind: &'static str,
            field: &'static str,
        ) -> Result<T, LineError> {
            value.ok_or(LineError::Missing { kind, field })
        }
        let kind = match line.kind {
            LineKind::Fail => Kind::Fail(v1::Fail::new(
                need(line.reason, "fail", "reason")?,
                line.detail.unwrap_or_default(),
                line.containers.unwrap_or_default(),
            )),
            LineKind::Completed => Kind::Completed(v1::Completed {}),
            LineKind::Running => Kind::Running(v1::Running {}),
            LineKind::Lost => Kind::Lost(v1::Lost {
                reason: need(line.reason, "lost", "reason")?,
            }),
            LineKind::Transfer => Kind::Transfer(v1::Transfer {
                from: need(line.from, "transfer", "from")?,
                to: need(line.to, "transfer", "to")?,
            }),
            LineKind::Duplicate => Kind::Duplicate(v1::Duplicate {
                basis: basis_named(line.reason.as_deref())? as i32,
                chosen: Some(need(line.chosen, "duplicate", "chosen")?),
                others: line.others.unwrap_or_default(),
                others_left_out: line.others_left_out.unwrap_or_default(),
            }),
            LineKind::Invalid => return Err(LineError::Invalid(line.error.unwrap_or_default())),
        };
        let kind_name = kind.name();
        let task = need(line.ti, kind_name, "ti")?;
        let pod = need(line.pod, kind_name, "pod")?;
        let resource_version = line.resource_version.unwrap_or_default();
        let id = line
            .id
            .unwrap_or_else(|| crate::msg_id::command(&pod.uid, &resource_version, kind_name));
        Ok(Command {
            id,
            task: Some(task),
            pod: Some(pod),
            owner: need(line.owner, kind_name, "owner")?,
            resource_version,
            kind: Some(kind),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "airflow".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn command(kind: Kind) -> Command {
        Command {
            id: "uid-p:7:x".into(),
            task: Some(TaskKey {
                dag_id: "d".into(),
                task_id: "t".into(),
                run_id: "r".into(),
                map_index: -1,
                try_number: 1,
                logical_date: String::new(),
                task_instance_id: String::new(),
            }),
            pod: Some(pod("p")),
            owner: "2".into(),
            resource_version: "7".into(),
            kind: Some(kind),
        }
    }

    #[test]
    fn fields_and_values_match_the_contract() {
        let fail = command(Kind::Fail(v1::Fail {
            reason: "pod_failed".into(),
            ..Default::default()
        }));
        let value = serde_json::to_value(CommandLine::from(&fail)).unwrap();
        assert_eq!(value["kind"], "fail");
        assert_eq!(value["reason"], "pod_failed");
        assert_eq!(value["owner"], "2");
        assert_eq!(
            value["ti"],
            json!({"dag_id": "d", "task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1})
        );
        assert_eq!(
            value["pod"],
            json!({"namespace": "airflow", "name": "p", "uid": "uid-p"})
        );

        let transfer = command(Kind::Transfer(v1::Transfer {
            from: "1".into(),
            to: "2".into(),
        }));
        let value = serde_json::to_value(CommandLine::from(&transfer)).unwrap();
        assert_eq!(
            (
                value["kind"].as_str(),
                value["from"].as_str(),
                value["to"].as_str()
            ),
            (Some("transfer"), Some("1"), Some("2"))
        );

        let duplicate = command(Kind::Duplicate(v1::Duplicate {
            chosen: Some(pod("a")),
            others: vec![pod("b")],
            ..Default::default()
        }));
        let value = serde_json::to_value(CommandLine::from(&duplicate)).unwrap();
        assert_eq!(value["chosen"]["name"], "a");
        assert_eq!(value["others"][0]["name"], "b");
        assert_eq!(
            value.get("reason"),
            None,
            "worker pods: semantics.md's order"
        );
        assert_eq!(value.get("others_left_out"), None, "none left out");
        let driver = command(Kind::Duplicate(v1::Duplicate {
            chosen: Some(pod("a")),
            others: vec![pod("b")],
            basis: v1::DuplicateBasis::SparkApplication as i32,
            ..Default::default()
        }));
        let value = serde_json::to_value(CommandLine::from(&driver)).unwrap();
        assert_eq!(value["reason"], "spark_application");
    }

    #[test]
    fn kinds_are_written_as_the_contract_names_them() {
        let kinds = [
            (LineKind::Fail, Kind::Fail(v1::Fail::default())),
            (LineKind::Completed, Kind::Completed(v1::Completed {})),
            (LineKind::Running, Kind::Running(v1::Running {})),
            (LineKind::Lost, Kind::Lost(v1::Lost::default())),
            (LineKind::Transfer, Kind::Transfer(v1::Transfer::default())),
            (
                LineKind::Duplicate,
                Kind::Duplicate(v1::Duplicate::default()),
            ),
        ];
        for (line_kind, kind) in kinds {
            assert_eq!(LineKind::from(&kind), line_kind);
            assert_eq!(serde_json::to_value(line_kind).unwrap(), json!(kind.name()));
            assert_eq!(line_kind.as_str(), kind.name());
        }
        assert_eq!(
            serde_json::to_value(LineKind::Invalid).unwrap(),
            json!("invalid")
        );
        assert_eq!(
            serde_json::from_value::<LineKind>(json!("transfer")).unwrap(),
            LineKind::Transfer
        );
    }

    #[test]
    fn every_kind_round_trips_through_its_line() {
        let kinds = [
            Kind::Fail(v1::Fail::new(
                "pod_failed".into(),
                "base exited 1".into(),
                vec![ContainerTerminated {
                    container: "base".into(),
                    exit_code: 1,
                    reason: "Error".into(),
                }],
            )),
            Kind::Completed(v1::Completed {}),
            Kind::Running(v1::Running {}),
            Kind::Lost(v1::Lost {
                reason: "deleted_while_pending".into(),
            }),
            Kind::Transfer(v1::Transfer {
                from: "1".into(),
                to: "2".into(),
            }),
            Kind::Duplicate(v1::Duplicate {
                chosen: Some(pod("a")),
                others: vec![pod("b"), pod("c")],
                ..Default::default()
            }),
            Kind::Duplicate(v1::Duplicate {
                chosen: Some(pod("a")),
                others: vec![pod("b")],
                basis: v1::DuplicateBasis::SparkPodFacts as i32,
                ..Default::default()
            }),
            Kind::Duplicate(v1::Duplicate {
                chosen: Some(pod("a")),
                others: vec![pod("b")],
                others_left_out: 5,
                ..Default::default()
            }),
        ];
        for kind in kinds {
            let original = command(kind);
            let text = serde_json::to_string(&CommandLine::from(&original)).unwrap();
            let back =
                Command::try_from(serde_json::from_str::<CommandLine>(&text).unwrap()).unwrap();
            assert_eq!(back, original, "{text}");
        }
    }

    #[test]
    fn lines_that_are_not_commands_are_refused_with_the_reason() {
        let invalid = CommandLine::invalid("not a pod", None);
        assert_eq!(
            Command::try_from(invalid),
            Err(LineError::Invalid("not a pod".into()))
        );
        let unknown = serde_json::from_value::<CommandLine>(json!({"kind": "explode"}));
        assert!(
            unknown.is_err_and(|e| e.to_string().contains("unknown variant `explode`")),
            "an unknown kind is refused by name"
        );
        let no_reason = CommandLine {
            kind: LineKind::Fail,
            ..Default::default()
        };
        assert_eq!(
            Command::try_from(no_reason),
            Err(LineError::Missing {
                kind: "fail",
                field: "reason"
            })
        );
        let odd_basis = CommandLine {
            kind: LineKind::Duplicate,
            reason: Some("coin_toss".into()),
            ..Default::default()
        };
        assert_eq!(
            Command::try_from(odd_basis),
            Err(LineError::Unknown {
                field: "reason",
                value: "coin_toss".into()
            })
        );
    }
}

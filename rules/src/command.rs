//! The commands the core decides, before they go on the wire.
//!
//! A [`TaskCommand`] borrows the TI key, and nearly always the pod, owner and
//! resourceVersion, from the event it was decided from: deciding an event
//! copies no strings for its commands. The edge that publishes or prints a
//! command turns it into the wire [`Command`] with [`TaskCommand::into_command`].

use std::borrow::Cow;

use podstream_proto::msg_id;
use podstream_proto::v1::{Command, PodRef, TaskKey, command::Kind};

/// One command to a task instance, as decided from one event.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskCommand<'e> {
    /// The task instance, from the event (with the UUID of the pod the command reports for).
    pub task: Cow<'e, TaskKey>,
    /// The pod the command reports for (the event's pod, or the chosen pod
    /// of the TI when the choice moved to another one).
    pub pod: Cow<'e, PodRef>,
    /// That pod's `airflow-worker` label value.
    pub owner: Cow<'e, str>,
    /// resourceVersion of that pod's event the command stems from.
    pub resource_version: Cow<'e, str>,
    /// What to do to the task instance.
    pub kind: Kind,
}

impl TaskCommand<'_> {
    /// The deterministic idempotency id (docs/contract.md): pod uid,
    /// resourceVersion and kind.
    pub fn id(&self) -> String {
        msg_id::command(&self.pod.uid, &self.resource_version, self.kind.name())
    }

    /// The wire form, for the bus, the outbox and `decide`'s output.
    pub fn into_command(self) -> Command {
        Command {
            id: self.id(),
            task: Some(self.task.into_owned()),
            pod: Some(self.pod.into_owned()),
            owner: self.owner.into_owned(),
            resource_version: self.resource_version.into_owned(),
            kind: Some(self.kind),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podstream_proto::v1::Running;

    #[test]
    fn the_wire_form_carries_every_field_and_the_id() {
        let task = TaskKey {
            dag_id: "etl".into(),
            task_id: "load".into(),
            run_id: "r1".into(),
            map_index: -1,
            try_number: 1,
            logical_date: String::new(),
            task_instance_id: String::new(),
        };
        let pod = PodRef {
            uid: "u1".into(),
            namespace: "airflow".into(),
            name: "load-1".into(),
        };
        let decided = TaskCommand {
            task: Cow::Borrowed(&task),
            pod: Cow::Borrowed(&pod),
            owner: Cow::Borrowed("2"),
            resource_version: Cow::Owned("42".into()),
            kind: Kind::Running(Running {}),
        };
        let wire = Command {
            id: "u1:42:running".into(),
            task: Some(task.clone()),
            pod: Some(pod.clone()),
            owner: "2".into(),
            resource_version: "42".into(),
            kind: Some(Kind::Running(Running {})),
        };
        assert_eq!(decided.into_command(), wire);
    }
}

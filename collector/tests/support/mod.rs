//! Stories of pod events decided by the processor's own core, and the collector's verdicts
//! on the commands they gave, as short lines.

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use podstream_collector::rule::{self, Settings, Verdict};
use podstream_proto::v1::{Command, PodEvent, TaskKey};
use podstream_rules::Rules;
use podstream_rules::record::TaskRecord;

/// The task records of a story, by key, and every command they gave, in order.
#[derive(Default)]
pub struct World {
    pub rules: Rules,
    pub records: HashMap<String, TaskRecord>,
    pub commands: Vec<Command>,
    sequence: u64,
}

impl World {
    /// A world whose processor decides by `rules`.
    pub fn with_rules(rules: Rules) -> World {
        World {
            rules,
            ..World::default()
        }
    }

    /// The processor decides `event`, as the service would, in stream order.
    pub fn see(&mut self, event: &PodEvent) {
        let key = TaskRecord::key(event.task.as_ref().unwrap());
        self.sequence += 1;
        let record = self.records.entry(key).or_default();
        let commands = record.apply(&self.rules, event, self.sequence).unwrap();
        self.commands.extend(commands);
    }

    /// The record of `task` now.
    pub fn record(&self, task: &TaskKey) -> Option<&TaskRecord> {
        self.records.get(&TaskRecord::key(task))
    }

    /// The collector's verdicts on `command`, judged `age` after it was published.
    pub fn judge(&self, command: &Command, age: Duration, settings: &Settings) -> Vec<Verdict> {
        rule::looks(command)
            .iter()
            .flat_map(|look| {
                let task = match look {
                    rule::Look::Superseded { earlier, .. } => earlier,
                    _ => command.task.as_ref().unwrap(),
                };
                rule::judge(look, self.record(task), age, settings)
            })
            .collect()
    }

    /// The last command of kind `kind` (`completed`, `fail`, `duplicate`, `running`).
    pub fn last(&self, kind: &str) -> &Command {
        self.commands
            .iter()
            .rev()
            .find(|c| c.kind.as_ref().is_some_and(|k| k.name() == kind))
            .unwrap_or_else(|| panic!("no {kind} command in {:?}", self.commands))
    }
}

/// A verdict as a short line: `delete a finished`, `delete a duplicate rv 4`, `label a`,
/// `wait a duplicate 10s`, `keep a drives`.
pub fn line(verdict: &Verdict) -> String {
    let pod = &verdict.pod().name;
    match verdict {
        Verdict::Delete {
            reason,
            resource_version,
            driver,
            ..
        } => {
            let rv = resource_version
                .as_ref()
                .map(|rv| format!(" rv {rv}"))
                .unwrap_or_default();
            let driver = driver
                .as_ref()
                .map(|d| format!(" for {}", d.name))
                .unwrap_or_default();
            format!("delete {pod} {}{rv}{driver}", reason.as_str())
        }
        Verdict::MarkDone { .. } => format!("label {pod}"),
        Verdict::Wait { reason, left, .. } => {
            format!("wait {pod} {} {}s", reason.as_str(), left.as_secs())
        }
        Verdict::Keep { why, .. } => format!("keep {pod} {}", why.as_str()),
    }
}

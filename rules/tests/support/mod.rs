//! A `PodEvent` builder for the core's tests: plain types, no JSON.

#![allow(dead_code)]

use podstream_proto::v1::{
    ContainerTerminated, ContainerWaiting, EventType, Phase, PodEvent, PodRef, TaskKey,
};

/// The TI every pod of these tests runs, unless a test says otherwise.
pub fn ti(try_number: i64) -> TaskKey {
    TaskKey {
        dag_id: "etl".into(),
        task_id: "load".into(),
        run_id: "manual__2026-11-30T10:00:00+00:00".into(),
        map_index: -1,
        try_number,
        logical_date: String::new(),
        task_instance_id: String::new(),
    }
}

/// An event of pod `name` (uid `uid-<name>`), owner `1`, created at second 0.
pub fn ev(kind: EventType, phase: Phase, name: &str, rv: u64) -> PodEvent {
    PodEvent {
        r#type: kind.into(),
        pod: Some(PodRef {
            namespace: "airflow".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }),
        owner: "1".into(),
        task: Some(ti(1)),
        phase: phase.into(),
        resource_version: rv.to_string(),
        ..PodEvent::default()
    }
}

/// Builder methods on `PodEvent`.
pub trait EventExt: Sized {
    fn with(self, f: impl FnOnce(&mut PodEvent)) -> Self;
    fn deleting(self) -> Self {
        self.with(|e| e.deletion_unix_ms = Some(1_000))
    }
    fn reason(self, reason: &str) -> Self {
        self.with(|e| e.status_reason = reason.into())
    }
    fn init_waiting(self, reason: &str, message: &str) -> Self {
        self.with(|e| e.init_waiting.push(waiting("init", reason, message)))
    }
    fn app_waiting(self, reason: &str, message: &str) -> Self {
        self.with(|e| e.first_app_waiting = Some(waiting("base", reason, message)))
    }
    fn exited(self, code: i32, reason: &str) -> Self {
        self.with(|e| {
            e.terminated.push(ContainerTerminated {
                container: "base".into(),
                exit_code: code,
                reason: reason.into(),
            })
        })
    }
    fn owner(self, owner: &str) -> Self {
        self.with(|e| e.owner = owner.into())
    }
    fn created(self, unix_ms: i64) -> Self {
        self.with(|e| e.creation_unix_ms = unix_ms)
    }
    fn revoked(self) -> Self {
        self.with(|e| e.revoked = true)
    }
    fn done(self) -> Self {
        self.with(|e| e.executor_done = true)
    }
    fn synthesized(self) -> Self {
        self.with(|e| e.synthesized = true)
    }
    /// Signed by the executor of these tests, as launched (call after changing the key).
    fn signed(self) -> Self {
        self.with(|e| {
            e.signature = signing().sign(e.pod.as_ref().unwrap(), e.task.as_ref().unwrap());
        })
    }
    /// Carrying the signature of pod `name`'s launch: a copy of its annotations.
    fn signature_of(self, name: &str) -> Self {
        self.with(|e| {
            let real = PodRef {
                name: name.into(),
                ..e.pod.clone().unwrap()
            };
            e.signature = signing().sign(&real, e.task.as_ref().unwrap());
        })
    }
    fn ti_id(self, uuid: &str) -> Self {
        self.with(|e| {
            if let Some(task) = e.task.as_mut() {
                task.task_instance_id = uuid.into();
            }
        })
    }
}

impl EventExt for PodEvent {
    fn with(mut self, f: impl FnOnce(&mut PodEvent)) -> Self {
        f(&mut self);
        self
    }
}

fn waiting(container: &str, reason: &str, message: &str) -> ContainerWaiting {
    ContainerWaiting {
        container: container.into(),
        reason: reason.into(),
        message: message.into(),
    }
}

use podstream_proto::Command;
use podstream_proto::signature::PodSigning;
use podstream_proto::v1::command::Kind;
use podstream_rules::{MemoryStore, Processor, Rules};

/// The key the executor of these tests signs its pods with.
pub const SIGNING_KEY: &str = "0123456789abcdef0123456789abcdef";

/// The signing of these tests' executor.
pub fn signing() -> PodSigning {
    PodSigning::new([SIGNING_KEY]).unwrap()
}

/// Rules that require pods signed with [`SIGNING_KEY`].
pub fn signed_rules() -> Rules {
    Rules::default().requiring_signatures(signing())
}

/// Feeds `events` through a fresh processor; every command as a short line.
pub fn run(events: &[PodEvent]) -> Vec<String> {
    run_with(Rules::default(), events)
}

/// [`run`] under `rules`.
pub fn run_with(rules: Rules, events: &[PodEvent]) -> Vec<String> {
    let mut processor = Processor::new(rules, MemoryStore::default());
    events
        .iter()
        .flat_map(|e| processor.handle(e).unwrap())
        .map(|c| describe(&c.into_command()))
        .collect()
}

/// `kind pod owner [details]`, e.g. `transfer a 2 1->2`.
pub fn describe(command: &Command) -> String {
    let pod = command.pod.as_ref().map_or("?", |p| p.name.as_str());
    let head = format!(
        "{} {pod} {}",
        command.kind.as_ref().map_or("none", |k| k.name()),
        command.owner
    );
    match &command.kind {
        Some(Kind::Fail(f)) => format!("{head} {}", f.reason),
        Some(Kind::Lost(l)) => format!("{head} {}", l.reason),
        Some(Kind::Transfer(t)) => format!("{head} {}->{}", t.from, t.to),
        Some(Kind::Duplicate(d)) => {
            let others: Vec<_> = d.others.iter().map(|p| p.name.as_str()).collect();
            format!(
                "{head} chosen={} others={}",
                d.chosen.as_ref().map_or("?", |p| p.name.as_str()),
                others.join(",")
            )
        }
        _ => head,
    }
}

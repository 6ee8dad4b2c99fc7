//! A task's history as a picture's model: one lane per task instance, a bar per pod made of
//! spans (one per pod event, coloured by phase), the owner changes on each bar, which pod
//! drives the TI, and podstream's commands as marks. Fed in time order by `replay` (and the
//! demo); drawn by [`crate::history::timeline_page`]. No I/O here.

use std::collections::{HashMap, HashSet};

use podstream_proto::line::{CommandLine, LineKind};
use podstream_proto::v1::{EventType, Phase};
use podstream_proto::{Command, PodEvent};

/// Lanes a page holds at most; the task instances beyond are counted and named as left out.
pub const MAX_LANES: usize = 200;

/// Undecodable messages a page names by stream sequence; the rest are only counted.
pub const MAX_UNREADABLE_NAMED: usize = 20;

/// Where a pod stood from one of its events on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Waiting to be scheduled or to start its containers.
    Pending,
    /// Running.
    Running,
    /// Ended successfully.
    Succeeded,
    /// Ended in failure.
    Failed,
    /// The kubelet lost track of it, or no phase yet.
    Unknown,
    /// Being deleted (a deletion timestamp, not yet gone).
    Terminating,
}

impl PodState {
    /// Its name, as the page's CSS class and legend say it.
    pub fn name(self) -> &'static str {
        match self {
            PodState::Pending => "pending",
            PodState::Running => "running",
            PodState::Succeeded => "succeeded",
            PodState::Failed => "failed",
            PodState::Unknown => "unknown",
            PodState::Terminating => "terminating",
        }
    }

    /// Every state, in the legend's order.
    pub const ALL: [PodState; 6] = [
        PodState::Pending,
        PodState::Running,
        PodState::Succeeded,
        PodState::Failed,
        PodState::Terminating,
        PodState::Unknown,
    ];

    fn of(event: &PodEvent) -> PodState {
        let phase = event.phase();
        let ended = matches!(phase, Phase::Succeeded | Phase::Failed);
        if event.deletion_unix_ms.is_some() && !ended {
            return PodState::Terminating;
        }
        match phase {
            Phase::Pending => PodState::Pending,
            Phase::Running => PodState::Running,
            Phase::Succeeded => PodState::Succeeded,
            Phase::Failed => PodState::Failed,
            Phase::Unknown | Phase::Unspecified => PodState::Unknown,
        }
    }
}

/// One pod event: the state it starts, and its facts.
#[derive(Debug, Clone)]
pub struct Span {
    /// When (Unix ms, the stream's time).
    pub from: i64,
    /// The pod's state from then on.
    pub state: PodState,
    /// resourceVersion, stream sequence, owner, as the page shows them.
    pub facts: String,
}

/// One pod of a task instance, over time.
#[derive(Debug, Clone)]
pub struct PodBar {
    /// The pod's name.
    pub name: String,
    /// Its uid.
    pub uid: String,
    /// Its events, in order.
    pub spans: Vec<Span>,
    /// When its `airflow-worker` label changed, and to what (the first is its first owner).
    pub owners: Vec<(i64, String)>,
    /// When the pod was gone (its `DELETED` event), if within the history.
    pub gone: Option<i64>,
    /// When the collector deleted it or labelled it done, and why (`finished`, `duplicate`,
    /// `stale`).
    pub collected: Option<(i64, String)>,
}

impl PodBar {
    /// Whether the history saw the pod end: gone, or last seen succeeded or failed.
    pub fn ended(&self) -> bool {
        self.gone.is_some()
            || self
                .spans
                .last()
                .is_some_and(|span| matches!(span.state, PodState::Succeeded | PodState::Failed))
    }
}

/// One of podstream's commands on a task instance.
#[derive(Debug, Clone)]
pub struct Mark {
    /// When it was published (Unix ms).
    pub at: i64,
    /// What it is.
    pub kind: LineKind,
    /// Its id (to match today's decision against it).
    pub id: String,
    /// Its facts: the pod, reason, from → to, sequence.
    pub facts: String,
    /// With `--decide`: what today's rules decide instead (`None`: the same).
    pub today: Option<String>,
}

/// The history of one task instance.
#[derive(Debug, Clone)]
pub struct Lane {
    /// The TI: `dag/task/run[map]#try`.
    pub ti: String,
    /// Its pods, in the order they appeared.
    pub pods: Vec<PodBar>,
    /// The commands on it.
    pub marks: Vec<Mark>,
    /// The pod that drives it, by the duplicate rule, once there were several.
    pub driver: Option<String>,
    /// Pods a command names that had no event in the history.
    pub unseen: Vec<String>,
}

/// The picture's model, built in time order.
#[derive(Debug, Default)]
pub struct Timeline {
    lanes: Vec<Lane>,
    by_ti: HashMap<String, usize>,
    left_out: HashSet<String>,
    unreadable: Vec<(&'static str, u64)>,
    unreadable_count: usize,
    first: Option<i64>,
    last: Option<i64>,
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Timeline {
        Timeline::default()
    }

    /// The lanes, in the order their TIs first appeared.
    pub fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    /// How many task instances were left out past [`MAX_LANES`].
    pub fn left_out(&self) -> usize {
        self.left_out.len()
    }

    /// A message of `stream` at `sequence`, published at `at`, that could not be decoded:
    /// it draws nothing, and the page says where it is.
    pub fn unreadable(&mut self, at: i64, stream: &'static str, sequence: u64) {
        self.seen(at);
        self.unreadable_count += 1;
        if self.unreadable.len() < MAX_UNREADABLE_NAMED {
            self.unreadable.push((stream, sequence));
        }
    }

    /// How many messages could not be decoded, and the first [`MAX_UNREADABLE_NAMED`] of
    /// them as (stream, sequence).
    pub fn unreadable_messages(&self) -> (usize, &[(&'static str, u64)]) {
        (self.unreadable_count, &self.unreadable)
    }

    /// The time span of what was fed (Unix ms), if anything was.
    pub fn span(&self) -> Option<(i64, i64)> {
        self.first.zip(self.last)
    }

    fn seen(&mut self, at: i64) {
        self.first = Some(self.first.map_or(at, |f| f.min(at)));
        self.last = Some(self.last.map_or(at, |l| l.max(at)));
    }

    fn lane(&mut self, ti: String) -> Option<&mut Lane> {
        if let Some(&index) = self.by_ti.get(&ti) {
            return self.lanes.get_mut(index);
        }
        if self.lanes.len() >= MAX_LANES {
            self.left_out.insert(ti);
            return None;
        }
        self.by_ti.insert(ti.clone(), self.lanes.len());
        self.lanes.push(Lane {
            ti,
            pods: Vec::new(),
            marks: Vec::new(),
            driver: None,
            unseen: Vec::new(),
        });
        self.lanes.last_mut()
    }

    /// A pod event published at `at` (Unix ms) with stream sequence `sequence`.
    pub fn pod_event(&mut self, at: i64, sequence: u64, event: &PodEvent) {
        self.seen(at);
        let (Some(task), Some(pod)) = (&event.task, &event.pod) else {
            return;
        };
        let Some(lane) = self.lane(task.to_string()) else {
            return;
        };
        let index = match lane.pods.iter().position(|p| p.uid == pod.uid) {
            Some(index) => index,
            None => {
                lane.pods.push(PodBar {
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    spans: Vec::new(),
                    owners: Vec::new(),
                    gone: None,
                    collected: None,
                });
                lane.unseen.retain(|name| *name != pod.name);
                lane.pods.len() - 1
            }
        };
        let bar = &mut lane.pods[index];
        if bar
            .owners
            .last()
            .is_none_or(|(_, owner)| *owner != event.owner)
        {
            bar.owners.push((at, event.owner.clone()));
        }
        let state = PodState::of(event);
        let deleted = event.r#type() == EventType::Deleted;
        let kind = match event.r#type() {
            EventType::Added => "added",
            EventType::Modified => "modified",
            EventType::Deleted => "deleted",
            EventType::Unspecified => "event",
        };
        let synthesized = if event.synthesized {
            " (synthesized: gone while unwatched)"
        } else {
            ""
        };
        bar.spans.push(Span {
            from: at,
            state,
            facts: format!(
                "pod {} {kind}{synthesized}: {}, owner {}, resourceVersion {}, pods#{sequence}",
                pod.name,
                state.name(),
                event.owner,
                event.resource_version
            ),
        });
        if deleted {
            bar.gone = Some(at);
        }
    }

    /// A command published at `at` with stream sequence `sequence`. A previous owner's copy
    /// of a transfer (role `left`) is the same command: the caller leaves it out.
    pub fn command(&mut self, at: i64, sequence: u64, command: &Command) {
        self.seen(at);
        let Some(task) = &command.task else { return };
        let Some(lane) = self.lane(task.to_string()) else {
            return;
        };
        let line = CommandLine::from(command);
        let mut named: Vec<&str> = command.pod.iter().map(|p| p.name.as_str()).collect();
        if let Some(podstream_proto::v1::command::Kind::Duplicate(duplicate)) = &command.kind {
            lane.driver = duplicate.chosen.as_ref().map(|p| p.name.clone());
            named.extend(duplicate.chosen.iter().map(|p| p.name.as_str()));
            named.extend(duplicate.others.iter().map(|p| p.name.as_str()));
        }
        for pod in named {
            if !pod.is_empty()
                && !lane.pods.iter().any(|p| p.name == pod)
                && !lane.unseen.iter().any(|p| p == pod)
            {
                lane.unseen.push(pod.to_owned());
            }
        }
        lane.marks.push(Mark {
            at,
            kind: line.kind,
            id: command.id.clone(),
            facts: format!("{}, commands#{sequence}", describe(command)),
            today: None,
        });
    }

    /// The collector deleted (or labelled done) a pod at `at`: marked on its bar.
    pub fn collected(&mut self, at: i64, collected: &podstream_collector::collected::Collected) {
        self.seen(at);
        let Some(lane) = self.lane(collected.ti.to_string()) else {
            return;
        };
        if let Some(bar) = lane.pods.iter_mut().find(|p| p.uid == collected.pod.uid) {
            bar.collected = Some((at, format!("{} ({})", collected.action, collected.reason)));
        }
    }

    /// With `--decide`: a command decided then (`then`) and what today's rules decide
    /// (`today`) differ; either may be missing.
    pub fn difference(&mut self, then: Option<&Command>, today: Option<&Command>) {
        let today_text = today.map_or_else(|| "nothing".to_owned(), describe);
        if let Some(then) = then {
            let lane = then
                .task
                .as_ref()
                .and_then(|task| self.by_ti.get(&task.to_string()))
                .and_then(|&index| self.lanes.get_mut(index));
            let found = lane.and_then(|lane| lane.marks.iter_mut().find(|mark| mark.id == then.id));
            if let Some(mark) = found {
                mark.today = Some(today_text);
            }
            return;
        }
        let Some(today) = today else { return };
        let Some(task) = &today.task else { return };
        let at = self.last.unwrap_or_default();
        if let Some(lane) = self.lane(task.to_string()) {
            let at = lane.marks.last().map_or(at, |m| m.at);
            lane.marks.push(Mark {
                at,
                kind: CommandLine::from(today).kind,
                id: today.id.clone(),
                facts: format!("today only: {}", describe(today)),
                today: Some(today_text),
            });
        }
    }
}

/// A command in words: its kind, pod and what it says.
fn describe(command: &Command) -> String {
    let line = CommandLine::from(command);
    let pod = command.pod.as_ref().map_or("", |p| p.name.as_str());
    let mut text = format!("{} {pod}", line.kind);
    if let Some(reason) = &line.reason {
        text.push_str(&format!(", reason {reason}"));
    }
    if let Some(podstream_proto::v1::command::Kind::Transfer(transfer)) = &command.kind {
        text.push_str(&format!(", scheduler {} → {}", transfer.from, transfer.to));
    }
    if let Some(podstream_proto::v1::command::Kind::Duplicate(duplicate)) = &command.kind {
        let others: Vec<&str> = duplicate.others.iter().map(|p| p.name.as_str()).collect();
        let chosen = duplicate.chosen.as_ref().map_or("", |p| p.name.as_str());
        text.push_str(&format!(", {chosen} drives, not {}", others.join(", ")));
    }
    text.push_str(&format!(", resourceVersion {}", command.resource_version));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use podstream_proto::v1::{self, PodRef, TaskKey, command::Kind};

    fn key(task: &str) -> TaskKey {
        TaskKey {
            dag_id: "etl".into(),
            task_id: task.into(),
            run_id: "r".into(),
            map_index: -1,
            try_number: 1,
            ..TaskKey::default()
        }
    }

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "airflow".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn event(task: &str, name: &str, owner: &str, phase: Phase, kind: EventType) -> PodEvent {
        PodEvent {
            pod: Some(pod(name)),
            owner: owner.into(),
            task: Some(key(task)),
            phase: phase as i32,
            r#type: kind as i32,
            resource_version: "1".into(),
            ..PodEvent::default()
        }
    }

    fn command(task: &str, name: &str, kind: Kind) -> Command {
        Command {
            id: format!("{task}-{name}"),
            task: Some(key(task)),
            pod: Some(pod(name)),
            owner: "1".into(),
            resource_version: "1".into(),
            kind: Some(kind),
        }
    }

    #[test]
    fn a_relabel_a_duplicate_and_a_command_for_an_unseen_pod() {
        let mut timeline = Timeline::new();
        let running = |owner| event("t", "p1", owner, Phase::Running, EventType::Modified);
        timeline.pod_event(1_000, 1, &running("1"));
        timeline.pod_event(2_000, 2, &running("2"));
        timeline.pod_event(
            2_500,
            3,
            &event("t", "p2", "2", Phase::Pending, EventType::Added),
        );
        let duplicate = Kind::Duplicate(v1::Duplicate {
            chosen: Some(pod("p1")),
            others: vec![pod("p2")],
            ..v1::Duplicate::default()
        });
        timeline.command(2_600, 1, &command("t", "p1", duplicate));
        let fail = Kind::Fail(v1::Fail {
            reason: "pod_failed".into(),
            ..v1::Fail::default()
        });
        timeline.command(3_000, 2, &command("t", "gone-pod", fail));

        let [lane] = timeline.lanes() else {
            panic!("one lane")
        };
        assert_eq!(lane.ti, "etl/t/r#1");
        assert_eq!(lane.pods.len(), 2);
        assert_eq!(
            lane.pods[0].owners,
            [(1_000, "1".to_owned()), (2_000, "2".to_owned())]
        );
        assert_eq!(lane.driver.as_deref(), Some("p1"));
        assert_eq!(lane.unseen, ["gone-pod"]);
        assert_eq!(lane.marks.len(), 2);
        assert!(
            lane.marks[1].facts.contains("reason pod_failed"),
            "{:?}",
            lane.marks[1]
        );
        assert_eq!(timeline.span(), Some((1_000, 3_000)));
    }

    #[test]
    fn states_by_phase_deletion_and_end() {
        let cases = [
            (
                Phase::Pending,
                None,
                EventType::Added,
                PodState::Pending,
                false,
            ),
            (
                Phase::Running,
                Some(5),
                EventType::Modified,
                PodState::Terminating,
                false,
            ),
            (
                Phase::Failed,
                Some(5),
                EventType::Modified,
                PodState::Failed,
                true,
            ),
            (
                Phase::Running,
                Some(5),
                EventType::Deleted,
                PodState::Terminating,
                true,
            ),
            (
                Phase::Unspecified,
                None,
                EventType::Added,
                PodState::Unknown,
                false,
            ),
        ];
        for (phase, deletion, kind, state, ended) in cases {
            let mut timeline = Timeline::new();
            let mut e = event("t", "p", "1", phase, kind);
            e.deletion_unix_ms = deletion;
            timeline.pod_event(1, 1, &e);
            let bar = &timeline.lanes()[0].pods[0];
            assert_eq!(bar.spans[0].state, state, "{phase:?} {deletion:?} {kind:?}");
            assert_eq!(bar.ended(), ended, "{phase:?} {deletion:?} {kind:?}");
        }
    }

    #[test]
    fn lanes_past_the_limit_are_counted_not_kept() {
        let mut timeline = Timeline::new();
        for i in 0..MAX_LANES + 7 {
            let task = format!("t{i}");
            timeline.pod_event(
                i as i64,
                1,
                &event(&task, "p", "1", Phase::Running, EventType::Added),
            );
        }
        assert_eq!(timeline.lanes().len(), MAX_LANES);
        assert_eq!(timeline.left_out(), 7);
    }

    #[test]
    fn a_difference_marks_the_command_then_or_adds_todays() {
        let mut timeline = Timeline::new();
        let completed = command("t", "p", Kind::Completed(v1::Completed {}));
        timeline.command(10, 1, &completed);
        let lost = command("t", "q", Kind::Lost(v1::Lost::default()));
        timeline.difference(Some(&completed), None);
        timeline.difference(None, Some(&lost));
        let marks = &timeline.lanes()[0].marks;
        assert_eq!(marks[0].today.as_deref(), Some("nothing"));
        assert_eq!(marks[1].kind, LineKind::Lost);
        assert!(marks[1].facts.starts_with("today only"));
    }
}

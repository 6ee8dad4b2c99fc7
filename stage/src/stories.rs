//! The seed stories played by real Airflow schedulers on the simulator: one long task
//! (`podstream_story.works`), and while it runs (b) a second scheduler adopts it while the
//! first is stopped past its health threshold, (c) the scheduler is killed -9 and restarted,
//! (d) a second pod for the running task appears and fails. Played with the stock executor
//! (`tests/tests/stock_airflow.rs`, the baselines of docs/stock-airflow.md), with podstream's
//! (`tests/tests/podstream_stories.rs`), and side by side by `podstream demo --airflow`.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::airflow::Airflow;
use crate::real_airflow::{Dags, Executor, RealAirflow};

/// The story DAG.
pub const DAG: &str = "podstream_story";
/// How long any step of a story may take.
pub const WAIT: Duration = Duration::from_secs(240);
/// The one callback a story's task may run: its first try succeeds.
pub const SUCCESS_ON_THE_FIRST_TRY: &str = "success.podstream_story.works.1";

/// A seed story: what happens while the story task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Story {
    /// (b) A second scheduler adopts the task: its pod is relabelled (seed 000).
    Adoption,
    /// (c) The scheduler is killed -9 and restarted (seed 001).
    Restart,
    /// (d) A second pod for the running task appears and fails (seed 003).
    SecondPod,
}

impl Story {
    /// Every story, in the seeds' order.
    pub const ALL: [Story; 3] = [Story::Adoption, Story::Restart, Story::SecondPod];

    /// What happens, in a few words.
    pub fn title(self) -> &'static str {
        match self {
            Story::Adoption => "adoption by a second scheduler",
            Story::Restart => "scheduler killed -9 and restarted",
            Story::SecondPod => "a second pod for the running task fails",
        }
    }

    /// The seed discussion the story comes from, and what it reported.
    pub fn seed(self) -> &'static str {
        match self {
            Story::Adoption => "seed 000: a relabel during adoption kills live tasks",
            Story::Restart => "seed 001: a restarted scheduler resets running tasks as orphans",
            Story::SecondPod => "seed 003: two pods for one task make reattachment fail",
        }
    }

    /// Plays the story's act on a running task.
    pub fn act(self, real: &mut RealAirflow) {
        match self {
            Story::Adoption => adopt_by_a_second_scheduler(real),
            Story::Restart => kill_and_restart_the_scheduler(real),
            Story::SecondPod => start_a_second_pod_that_fails(real),
        }
    }

    /// The index of the scheduler the story kills, if it kills one.
    pub fn killed_scheduler(self) -> Option<usize> {
        (self == Story::Restart).then_some(0)
    }
}

/// The story task's (try_number, state, queued_by_job_id).
pub fn story_ti(real: &RealAirflow) -> Option<(String, String, String)> {
    real.query(
        "SELECT try_number, coalesce(state, 'none'), coalesce(queued_by_job_id::text, '-') \
         FROM task_instance WHERE task_id = 'works'",
    )
    .into_iter()
    .find_map(|row| {
        Some((
            row.first()?.clone(),
            row.get(1)?.clone(),
            row.get(2)?.clone(),
        ))
    })
}

fn running(real: &RealAirflow) -> bool {
    story_ti(real).is_some_and(|(_, state, _)| state == "running")
}

/// Plays `story` until the task runs, then its act, then waits for the run to end; returns
/// the stage and the run's state.
pub fn play(airflow: Airflow, executor: Executor, story: Story) -> (RealAirflow, String) {
    let mut real = RealAirflow::start_with(airflow, Dags::Story, executor);
    real.wait_until("the story task to run", WAIT, running);
    story.act(&mut real);
    let state = real.wait_for_run(DAG, WAIT);
    // Give the executor a moment to finish with the pods before the timeline is read.
    std::thread::sleep(Duration::from_secs(3));
    (real, state)
}

/// The heading of a played story's timeline.
pub fn heading(airflow: Airflow, executor: Executor, story: Story, state: &str) -> String {
    format!(
        "=== Airflow {}, {executor:?} executor ({}): run {state}",
        airflow.short(),
        story.title()
    )
}

/// How a played story ended, in one line: the run, the task's last try, the callbacks.
pub fn outcome(real: &RealAirflow, state: &str) -> String {
    let task = story_ti(real).map_or_else(
        || "no task instance".to_owned(),
        |(try_number, state, _)| format!("try {try_number} {state}"),
    );
    let callbacks: Vec<String> = real
        .markers()
        .iter()
        .filter_map(|marker| {
            // `kind.dag.task.try`
            let mut parts = marker.split('.');
            let kind = parts.next()?;
            let try_number = parts.nth(2)?;
            Some(format!("{kind} (try {try_number})"))
        })
        .collect();
    let callbacks = if callbacks.is_empty() {
        "none".to_owned()
    } else {
        callbacks.join(", ")
    };
    format!("run {state}; task {task}; callbacks: {callbacks}")
}

/// Whether a story ended as it must with podstream: the run succeeded on the first try with
/// one success callback, and every scheduler still alive (all but the story's killed one)
/// ends with no task in its executor. `Err` says what did not hold.
pub fn ended_right(real: &RealAirflow, state: &str, story: Story) -> Result<(), String> {
    if state != "success" {
        return Err(format!("the run ended {state}, not success"));
    }
    let task = story_ti(real).map(|(try_number, state, _)| (try_number, state));
    if task != Some(("1".to_owned(), "success".to_owned())) {
        return Err(format!("the first try did not run to its end: {task:?}"));
    }
    let markers = real.markers();
    if markers != [SUCCESS_ON_THE_FIRST_TRY] {
        return Err(format!("callbacks {markers:?}, not one success"));
    }
    // No slot leaks (stock multi-scheduler installs leaked them: #32928, #35675). An
    // executor frees the slot when it handles the pod's completion, a moment after the run
    // ends: wait for that.
    let deadline = Instant::now() + SLOTS_FREED;
    loop {
        match slots_freed(real, story) {
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(500)),
            freed => return freed,
        }
    }
}

/// How long after its run ends a story's executors may take to free the task's slot.
const SLOTS_FREED: Duration = Duration::from_secs(60);

/// Every scheduler still alive (all but the story's killed one) last said its executor runs
/// no task, and at least one said how many it runs.
fn slots_freed(real: &RealAirflow, story: Story) -> Result<(), String> {
    let logs = real.logs_of("scheduler");
    if !logs
        .iter()
        .any(|log| log.contains(" task(s) running in this executor"))
    {
        return Err("no executor said how many tasks it runs".to_owned());
    }
    for (index, log) in logs.iter().enumerate() {
        if Some(index) == story.killed_scheduler() {
            continue;
        }
        let last = log
            .lines()
            .rev()
            .filter_map(|line| line.split("podstream: ").nth(1))
            .find_map(|said| said.split_once(" task(s) running in this executor"))
            .map(|(count, _)| count);
        if let Some(count) = last.filter(|n| *n != "0") {
            return Err(format!(
                "the scheduler started {} ends with {count} task(s) in its executor",
                index + 1
            ));
        }
    }
    Ok(())
}

/// (b) The scheduler is stopped past its health threshold; a second one adopts the task;
/// the first comes back.
fn adopt_by_a_second_scheduler(real: &mut RealAirflow) {
    let Some(first) = real.component("scheduler") else {
        panic!("no scheduler to stop");
    };
    let owner = story_ti(real).map(|(_, _, owner)| owner);
    real.signal(first, Signal::SIGSTOP);
    real.start_component("scheduler");
    real.wait_until("the second scheduler to adopt the task", WAIT, |r| {
        story_ti(r).map(|(_, _, by)| by) != owner
    });
    real.signal(first, Signal::SIGCONT);
}

/// (c) The scheduler is killed -9 and started again.
fn kill_and_restart_the_scheduler(real: &mut RealAirflow) {
    let Some(first) = real.component("scheduler") else {
        panic!("no scheduler to kill");
    };
    real.signal(first, Signal::SIGKILL);
    real.start_component("scheduler");
}

/// (d) A second pod for the running task, which fails after a few seconds.
fn start_a_second_pod_that_fails(real: &mut RealAirflow) {
    let pods = real.pods();
    let Some(original) = pods
        .iter()
        .find(|p| p["metadata"]["annotations"]["task_id"] == "works")
    else {
        panic!("the task's pod is not there");
    };
    real.create_pod(&duplicate(original));
}

/// The same pod again under another name (as a relaunch after a reset would make it), whose
/// container fails after a few seconds.
fn duplicate(pod: &Value) -> Value {
    let mut copy = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("{}-second", pod["metadata"]["name"].as_str().unwrap_or("pod")),
            "namespace": pod["metadata"]["namespace"],
            "labels": pod["metadata"]["labels"],
            "annotations": pod["metadata"]["annotations"],
        },
        "spec": pod["spec"],
    });
    if let Some(spec) = copy["spec"].as_object_mut() {
        spec.remove("nodeName");
    }
    copy["spec"]["containers"][0]["command"] = json!(["sh", "-c", "sleep 3; exit 1"]);
    copy["spec"]["containers"][0]["args"] = json!([]);
    copy
}

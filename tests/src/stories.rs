//! The seed stories played by real Airflow schedulers on the simulator: one long task
//! (`podstream_story.works`), and while it runs (b) a second scheduler adopts it while the
//! first is stopped past its health threshold, (c) the scheduler is killed -9 and restarted,
//! (d) a second pod for the running task appears and fails. Played with the stock executor
//! (`tests/tests/stock_airflow.rs`, the baselines of docs/stock-airflow.md) and with
//! podstream's (`tests/tests/podstream_stories.rs`).

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::airflow::Airflow;
use crate::real_airflow::{Dags, Executor, RealAirflow};

/// The story DAG.
pub const DAG: &str = "podstream_story";
/// How long any step of a story may take.
pub const WAIT: Duration = Duration::from_secs(240);

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

/// Plays the story until the task runs, then `act`, then waits for the run to end; prints
/// the timeline and returns the run's state.
pub fn play(
    airflow: Airflow,
    executor: Executor,
    title: &str,
    act: impl FnOnce(&mut RealAirflow),
) -> (RealAirflow, String) {
    let mut real = RealAirflow::start_with(airflow, Dags::Story, executor);
    real.wait_until("the story task to run", WAIT, running);
    act(&mut real);
    let state = real.wait_for_run(DAG, WAIT);
    // Give the executor a moment to finish with the pods before the timeline is read.
    std::thread::sleep(Duration::from_secs(3));
    println!(
        "=== Airflow {}, {executor:?} executor ({title}): run {state}\n{}",
        airflow.short(),
        real.timeline()
    );
    (real, state)
}

/// (b) The scheduler is stopped past its health threshold; a second one adopts the task;
/// the first comes back.
pub fn adopt_by_a_second_scheduler(real: &mut RealAirflow) {
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
pub fn kill_and_restart_the_scheduler(real: &mut RealAirflow) {
    let Some(first) = real.component("scheduler") else {
        panic!("no scheduler to kill");
    };
    real.signal(first, Signal::SIGKILL);
    real.start_component("scheduler");
}

/// (d) A second pod for the running task, which fails after a few seconds.
pub fn start_a_second_pod_that_fails(real: &mut RealAirflow) {
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

//! Stock Airflow's behaviour in the seed stories, recorded: a real scheduler of each release
//! with the stock KubernetesExecutor on `podstream sim --kubelet`, one long task, and
//! (b) a second scheduler adopting it while the first is stopped past its health threshold,
//! (c) the scheduler killed -9 and restarted while it runs, (d) a second pod for the running
//! task that then fails. Each test prints its timeline (pods, TIs, scheduler jobs, callbacks)
//! and asserts what stock Airflow did: these are the baselines podstream is compared against
//! (docs/stock-airflow.md). The normal run (a) is tests/tests/real_airflow.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use nix::sys::signal::Signal;
use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::{Dags, RealAirflow};
use serde_json::{Value, json};

const DAG: &str = "podstream_story";
const WAIT: Duration = Duration::from_secs(240);

/// The story task's (try_number, state, queued_by_job_id).
fn story_ti(real: &RealAirflow) -> Option<(String, String, String)> {
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

/// Plays the story until the task runs, then `act`, then waits for the run to end.
fn play(
    airflow: Airflow,
    title: &str,
    act: impl FnOnce(&mut RealAirflow),
) -> (RealAirflow, String) {
    let mut real = RealAirflow::start(airflow, Dags::Story);
    real.wait_until("the story task to run", WAIT, running);
    act(&mut real);
    let state = real.wait_for_run(DAG, WAIT);
    // Give the executor a moment to finish with the pods before the timeline is read.
    std::thread::sleep(Duration::from_secs(3));
    println!(
        "=== stock Airflow {} ({title}): run {state}\n{}",
        airflow.short(),
        real.timeline()
    );
    (real, state)
}

fn adoption(airflow: Airflow) {
    let (real, state) = play(airflow, "adoption by a second scheduler", |real| {
        let first = real.component("scheduler").unwrap();
        let (_, _, owner) = story_ti(real).unwrap();
        real.signal(first, Signal::SIGSTOP);
        real.start_component("scheduler");
        real.wait_until("the second scheduler to adopt the task", WAIT, |r| {
            story_ti(r).is_some_and(|(_, _, by)| by != owner)
        });
        real.signal(first, Signal::SIGCONT);
    });
    assert_eq!(state, "success", "{}", real.timeline());
    assert_eq!(real.markers(), ["success.podstream_story.works.1"]);
}

fn restart(airflow: Airflow) {
    let (real, state) = play(airflow, "scheduler killed -9 and restarted", |real| {
        let first = real.component("scheduler").unwrap();
        real.signal(first, Signal::SIGKILL);
        real.start_component("scheduler");
    });
    assert_eq!(state, "success", "{}", real.timeline());
    assert_eq!(real.markers(), ["success.podstream_story.works.1"]);
}

fn second_pod(airflow: Airflow) {
    let (real, state) = play(airflow, "a second pod for the running task fails", |real| {
        let pods = real.pods();
        let original = pods
            .iter()
            .find(|p| p["metadata"]["annotations"]["task_id"] == "works")
            .expect("the task's pod");
        real.create_pod(&duplicate(original));
    });
    assert_eq!(state, "success", "{}", real.timeline());
    // What each release's executor makes of the loser's failure (docs/stock-airflow.md).
    let expected: &[&str] = if airflow.is_3() {
        // The failure is the task's: try 1 is failed while its pod still runs, and retried.
        &[
            "retry.podstream_story.works.1",
            "success.podstream_story.works.2",
        ]
    } else {
        // 2.x acts on an executor failure only for a queued task: the running try goes on.
        &["success.podstream_story.works.1"]
    };
    assert_eq!(real.markers(), expected, "{}", real.timeline());
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
    copy["spec"].as_object_mut().unwrap().remove("nodeName");
    copy["spec"]["containers"][0]["command"] = json!(["sh", "-c", "sleep 3; exit 1"]);
    copy["spec"]["containers"][0]["args"] = json!([]);
    copy
}

#[test]
fn stock_airflow_2_10_adoption() {
    adoption(Airflow::line("2.10"));
}

#[test]
fn stock_airflow_2_11_adoption() {
    adoption(Airflow::line("2.11"));
}

#[test]
fn stock_airflow_3_1_adoption() {
    adoption(Airflow::line("3.1"));
}

#[test]
fn stock_airflow_3_3_adoption() {
    adoption(Airflow::line("3.3"));
}

#[test]
fn stock_airflow_2_10_restart() {
    restart(Airflow::line("2.10"));
}

#[test]
fn stock_airflow_2_11_restart() {
    restart(Airflow::line("2.11"));
}

#[test]
fn stock_airflow_3_1_restart() {
    restart(Airflow::line("3.1"));
}

#[test]
fn stock_airflow_3_3_restart() {
    restart(Airflow::line("3.3"));
}

#[test]
fn stock_airflow_2_10_second_pod() {
    second_pod(Airflow::line("2.10"));
}

#[test]
fn stock_airflow_2_11_second_pod() {
    second_pod(Airflow::line("2.11"));
}

#[test]
fn stock_airflow_3_1_second_pod() {
    second_pod(Airflow::line("3.1"));
}

#[test]
fn stock_airflow_3_3_second_pod() {
    second_pod(Airflow::line("3.3"));
}

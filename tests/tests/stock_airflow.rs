//! Stock Airflow's behaviour in the seed stories, recorded: a real scheduler of each release
//! with the stock KubernetesExecutor on `podstream sim --kubelet` (see `podstream_tests::stories`).
//! Each test prints its timeline (pods, TIs, scheduler jobs, callbacks) and asserts what stock
//! Airflow did: these are the baselines podstream is compared against
//! (docs/stock-airflow.md). The normal run (a) is tests/tests/real_airflow.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::Executor;
use podstream_tests::stories::{
    adopt_by_a_second_scheduler, kill_and_restart_the_scheduler, play,
    start_a_second_pod_that_fails,
};

fn adoption(airflow: Airflow) {
    let (real, state) = play(
        airflow,
        Executor::Stock,
        "adoption by a second scheduler",
        adopt_by_a_second_scheduler,
    );
    assert_eq!(state, "success", "{}", real.timeline());
    assert_eq!(real.markers(), ["success.podstream_story.works.1"]);
}

fn restart(airflow: Airflow) {
    let (real, state) = play(
        airflow,
        Executor::Stock,
        "scheduler killed -9 and restarted",
        kill_and_restart_the_scheduler,
    );
    assert_eq!(state, "success", "{}", real.timeline());
    assert_eq!(real.markers(), ["success.podstream_story.works.1"]);
}

fn second_pod(airflow: Airflow) {
    let (real, state) = play(
        airflow,
        Executor::Stock,
        "a second pod for the running task fails",
        start_a_second_pod_that_fails,
    );
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

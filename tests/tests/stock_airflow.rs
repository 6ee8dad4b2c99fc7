//! Stock Airflow's behaviour in the seed stories, recorded: a real scheduler of each release
//! with the stock KubernetesExecutor on `podstream sim --kubelet` (see `podstream_tests::stories`).
//! Each test prints its timeline (pods, TIs, scheduler jobs, callbacks) and asserts what stock
//! Airflow did: these are the baselines podstream is compared against
//! (docs/stock-airflow.md). The normal run (a) is tests/tests/real_airflow.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::{Executor, RealAirflow};
use podstream_tests::stories::{SUCCESS_ON_THE_FIRST_TRY, Story, heading, play};

/// Plays `story` with the stock executor and prints its timeline.
fn stock(airflow: Airflow, story: Story) -> (RealAirflow, String) {
    let (real, state) = play(airflow, Executor::Stock, story);
    println!(
        "{}\n{}",
        heading(airflow, Executor::Stock, story, &state),
        real.timeline()
    );
    (real, state)
}

fn adoption(airflow: Airflow) {
    let (real, state) = stock(airflow, Story::Adoption);
    assert_eq!(state, "success", "{}", real.timeline());
    assert_eq!(real.markers(), [SUCCESS_ON_THE_FIRST_TRY]);
}

fn restart(airflow: Airflow) {
    let (real, state) = stock(airflow, Story::Restart);
    assert_eq!(state, "success", "{}", real.timeline());
    assert_eq!(real.markers(), [SUCCESS_ON_THE_FIRST_TRY]);
}

fn second_pod(airflow: Airflow) {
    let (real, state) = stock(airflow, Story::SecondPod);
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
        &[SUCCESS_ON_THE_FIRST_TRY]
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

//! The seed stories with podstream: real schedulers of Airflow 2.10.5 and 3.1.8 run
//! podstream-airflow's `PodstreamKubernetesExecutor` beside `podstream run --task-failures
//! executor` on `podstream sim --kubelet` (see `podstream_tests::stories`; the stock
//! executor's outcomes are tests/tests/stock_airflow.rs). With podstream no running task is
//! failed, reset or retried by an adoption, a scheduler restart or a second pod: each story
//! ends with the task's first try succeeding and its success callback run once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::Executor;
use podstream_tests::stories::{Story, ended_right, heading, play};

/// Plays `story` with podstream's executor; it must end right.
fn with_podstream(airflow: Airflow, story: Story) {
    let (real, state) = play(airflow, Executor::Podstream, story);
    let timeline = real.timeline();
    println!(
        "{}\n{timeline}",
        heading(airflow, Executor::Podstream, story, &state)
    );
    if let Err(why) = ended_right(&real, &state, story) {
        panic!("Airflow {}: {why}\n{timeline}", airflow.short());
    }
}

#[test]
fn podstream_airflow_2_10_adoption() {
    with_podstream(Airflow::line("2.10"), Story::Adoption);
}

#[test]
fn podstream_airflow_3_1_adoption() {
    with_podstream(Airflow::line("3.1"), Story::Adoption);
}

#[test]
fn podstream_airflow_2_10_restart() {
    with_podstream(Airflow::line("2.10"), Story::Restart);
}

#[test]
fn podstream_airflow_3_1_restart() {
    with_podstream(Airflow::line("3.1"), Story::Restart);
}

#[test]
fn podstream_airflow_2_10_second_pod() {
    with_podstream(Airflow::line("2.10"), Story::SecondPod);
}

#[test]
fn podstream_airflow_3_1_second_pod() {
    with_podstream(Airflow::line("3.1"), Story::SecondPod);
}

//! The seed stories with podstream: real schedulers of Airflow 2.10.5 and 3.1.8 run
//! podstream-airflow's `PodstreamKubernetesExecutor` beside `podstream run --task-failures
//! executor` on `podstream sim --kubelet` (see `podstream_tests::stories`; the stock
//! executor's outcomes are tests/tests/stock_airflow.rs). With podstream no running task is
//! failed, reset or retried by an adoption, a scheduler restart or a second pod: each story
//! ends with the task's first try succeeding and its success callback run once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::{Executor, RealAirflow};
use podstream_tests::stories::{
    adopt_by_a_second_scheduler, kill_and_restart_the_scheduler, play,
    start_a_second_pod_that_fails, story_ti,
};

/// The story ended right: the run succeeded on the first try, with one success callback, and
/// every scheduler still alive (all but `killed`) ends with no task in its executor.
fn ended_right(airflow: Airflow, real: &RealAirflow, state: &str, killed: Option<usize>) {
    let version = airflow.short();
    assert_eq!(state, "success", "Airflow {version}\n{}", real.timeline());
    assert_eq!(
        story_ti(real).map(|(try_number, state, _)| (try_number, state)),
        Some(("1".to_owned(), "success".to_owned())),
        "Airflow {version}: the first try ran to its end\n{}",
        real.timeline()
    );
    assert_eq!(
        real.markers(),
        ["success.podstream_story.works.1"],
        "Airflow {version}: one callback, no retry\n{}",
        real.timeline()
    );
    // No slot leaks (stock multi-scheduler installs leaked them: #32928, #35675).
    let logs = real.logs_of("scheduler");
    assert!(
        logs.iter()
            .any(|log| log.contains(" task(s) running in this executor")),
        "Airflow {version}: the executors say how many tasks they run"
    );
    for (index, log) in logs.iter().enumerate() {
        if Some(index) == killed {
            continue;
        }
        let last = log
            .lines()
            .rev()
            .filter_map(|line| line.split("podstream: ").nth(1))
            .find_map(|said| said.split_once(" task(s) running in this executor"))
            .map(|(count, _)| count);
        assert!(
            last.is_none_or(|n| n == "0"),
            "Airflow {version}: scheduler #{index} ends with {last:?} task(s) running\n{log}"
        );
    }
}

fn adoption(airflow: Airflow) {
    let (real, state) = play(
        airflow,
        Executor::Podstream,
        "adoption by a second scheduler",
        adopt_by_a_second_scheduler,
    );
    ended_right(airflow, &real, &state, None);
}

fn restart(airflow: Airflow) {
    let (real, state) = play(
        airflow,
        Executor::Podstream,
        "scheduler killed -9 and restarted",
        kill_and_restart_the_scheduler,
    );
    ended_right(airflow, &real, &state, Some(0));
}

fn second_pod(airflow: Airflow) {
    let (real, state) = play(
        airflow,
        Executor::Podstream,
        "a second pod for the running task fails",
        start_a_second_pod_that_fails,
    );
    ended_right(airflow, &real, &state, None);
}

#[test]
fn podstream_airflow_2_10_adoption() {
    adoption(Airflow::line("2.10"));
}

#[test]
fn podstream_airflow_3_1_adoption() {
    adoption(Airflow::line("3.1"));
}

#[test]
fn podstream_airflow_2_10_restart() {
    restart(Airflow::line("2.10"));
}

#[test]
fn podstream_airflow_3_1_restart() {
    restart(Airflow::line("3.1"));
}

#[test]
fn podstream_airflow_2_10_second_pod() {
    second_pod(Airflow::line("2.10"));
}

#[test]
fn podstream_airflow_3_1_second_pod() {
    second_pod(Airflow::line("3.1"));
}

//! The seed stories on a real Kubernetes control plane: real Airflow 3.1 schedulers whose
//! kubernetes client talks to kube-apiserver (RBAC and admission on), `podstream kubelet` as
//! the node, once with the stock KubernetesExecutor and once with `PodstreamKubernetesExecutor`
//! beside `podstream run`; one story per seed. What each executor makes of each story is the
//! same as on the simulator (tests/tests/stock_airflow.rs and podstream_stories.rs): the story
//! outcomes do not hang on the simulator's own answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::{Executor, Kubernetes};
use podstream_tests::stories::{Story, ended_right, heading, outcome, play_on};

/// Plays `story` with each executor on the real API server: podstream's must end right; the
/// stock one's outcome must be `stock` (its callbacks, as on the simulator).
fn side_by_side(story: Story, stock: &[&str]) {
    let airflow = Airflow::line("3.1");
    let (real, state) = play_on(airflow, Executor::Stock, story, Kubernetes::Real);
    println!(
        "{}\n{}\n{}",
        heading(airflow, Executor::Stock, story, &state),
        outcome(&real, &state),
        real.timeline()
    );
    assert_eq!(state, "success", "{}", real.timeline());
    assert_eq!(real.markers(), stock, "{}", real.timeline());
    drop(real);

    let (real, state) = play_on(airflow, Executor::Podstream, story, Kubernetes::Real);
    println!(
        "{}\n{}\n{}",
        heading(airflow, Executor::Podstream, story, &state),
        outcome(&real, &state),
        real.timeline()
    );
    if let Err(why) = ended_right(&real, &state, story) {
        panic!("{why}\n{}", real.timeline());
    }
}

/// Seed 001: a relabel during adoption while the task runs.
#[test]
fn seed_001_adoption_on_a_real_api_server() {
    let (_, callbacks) = Story::Adoption.right_ending(Airflow::line("3.1"));
    side_by_side(Story::Adoption, callbacks);
}

/// Seed 002: a scheduler restart with running pods.
#[test]
fn seed_002_restart_on_a_real_api_server() {
    let (_, callbacks) = Story::Restart.right_ending(Airflow::line("3.1"));
    side_by_side(Story::Restart, callbacks);
}

/// Seed 003: a second pod for the running task fails; Airflow 3.1's stock executor fails
/// the live try for it and retries.
#[test]
fn seed_003_second_pod_on_a_real_api_server() {
    side_by_side(
        Story::SecondPod,
        &[
            "retry.podstream_story.works.1",
            "success.podstream_story.works.2",
        ],
    );
}

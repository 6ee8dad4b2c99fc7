//! The seed stories with podstream: real schedulers of Airflow 2.10.5 and 3.1.8 run
//! podstream-airflow's `PodstreamKubernetesExecutor` beside `podstream run --task-failures
//! executor` on `podstream sim --kubelet` (see `podstream_tests::stories`; the stock
//! executor's outcomes are tests/tests/airflow/stock_airflow.rs). With podstream no running task is
//! failed, reset or retried by an adoption, a scheduler restart or a second pod: each story
//! ends with the task's first try succeeding and its success callback run once. When the pod
//! ends while its scheduler is down, the scheduler that starts next learns how it ended: a
//! pod that died fails its try once and the retry succeeds, a task that succeeded stays a
//! success, a deleted pod's TI is reset and runs again; no pod of the task is left but a
//! failed one (kept for its logs, as Airflow's default says).

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::{Executor, RealAirflow};
use podstream_tests::stories::{
    FORGED_SUFFIX, STORY_RUN_ID, Story, copy_refused, ended_right, heading, play,
};

/// Plays `story` with podstream's executor; it must end right, and a trust story's copy must
/// have been refused. Returns the stage.
fn with_podstream(airflow: Airflow, story: Story) -> RealAirflow {
    let (real, state) = play(airflow, Executor::Podstream, story);
    let timeline = real.timeline();
    println!(
        "{}\n{timeline}",
        heading(airflow, Executor::Podstream, story, &state)
    );
    if let Err(why) = ended_right(&real, &state, story).and_then(|()| copy_refused(&real, story)) {
        panic!(
            "Airflow {}: {why}\n{timeline}\n{}",
            airflow.short(),
            real.failed_pods()
        );
    }
    real
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

// While its scheduler is down (issue: an outcome must reach the scheduler that adopts the
// task): the pod ends while no scheduler runs, then a new scheduler starts.

#[test]
fn podstream_airflow_3_1_pod_dies_while_down() {
    let real = with_podstream(Airflow::line("3.1"), Story::DiesWhileDown);
    // The pod that died on purpose is kept (Airflow's default) and its report names the
    // cause: how its container ended and the line the task wrote on the pod's log.
    let report = real.failed_pods();
    assert!(
        report.contains("exited 137") && report.contains("try 1 told to die"),
        "the failed pod's report does not name its cause:\n{report}"
    );
}

#[test]
fn podstream_airflow_3_1_task_succeeds_while_down() {
    with_podstream(Airflow::line("3.1"), Story::SucceedsWhileDown);
}

#[test]
fn podstream_airflow_3_1_pod_deleted_while_down() {
    with_podstream(Airflow::line("3.1"), Story::DeletedWhileDown);
}

#[test]
fn podstream_airflow_3_1_killed_after_taking_a_fail() {
    with_podstream(Airflow::line("3.1"), Story::KilledAfterTakingAFail);
}

// The same on Airflow 2.10, outside CI's time (`--include-ignored`).

#[test]
#[ignore = "the 2.x line of the while-down stories: --include-ignored (docs/stock-airflow.md)"]
fn podstream_airflow_2_10_pod_dies_while_down() {
    with_podstream(Airflow::line("2.10"), Story::DiesWhileDown);
}

#[test]
#[ignore = "the 2.x line of the while-down stories: --include-ignored (docs/stock-airflow.md)"]
fn podstream_airflow_2_10_task_succeeds_while_down() {
    with_podstream(Airflow::line("2.10"), Story::SucceedsWhileDown);
}

#[test]
#[ignore = "the 2.x line of the while-down stories: --include-ignored (docs/stock-airflow.md)"]
fn podstream_airflow_2_10_pod_deleted_while_down() {
    with_podstream(Airflow::line("2.10"), Story::DeletedWhileDown);
}

#[test]
#[ignore = "the 2.x line of the while-down stories: --include-ignored (docs/stock-airflow.md)"]
fn podstream_airflow_2_10_killed_after_taking_a_fail() {
    with_podstream(Airflow::line("2.10"), Story::KilledAfterTakingAFail);
}

// Trust: a pod that copies the running task's labels and annotations under another
// task_instance_id fails; podstream's sink and executor take it as foreign.

#[test]
fn podstream_airflow_3_1_forged_pod() {
    let real = with_podstream(Airflow::line("3.1"), Story::ForgedPod);
    // The first try ran to its end (with_podstream): the real pod was neither failed nor
    // deleted. The forged pod is left as it is: nothing of podstream's may delete it.
    let forged: Vec<String> = real
        .pods()
        .iter()
        .filter(|pod| {
            pod["metadata"]["name"]
                .as_str()
                .is_some_and(|name| name.ends_with(FORGED_SUFFIX))
        })
        .map(|pod| pod["status"]["phase"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(forged, ["Failed"], "{}", real.timeline());
}

// Trust: a copy of the task's pod made before the real one, succeeding at once, settles
// nothing (it carries no signature of the executor's): the real pod's failure still fails
// try 1 once, and try 2 succeeds.

#[test]
fn podstream_airflow_3_1_copy_first() {
    let real = with_podstream(Airflow::line("3.1"), Story::CopyFirst);
    let runs = real.query("SELECT DISTINCT run_id FROM task_instance WHERE task_id = 'works'");
    assert_eq!(
        runs,
        [[STORY_RUN_ID]],
        "the copy named the run the task ran in"
    );
}

// Trust: while the task's pod waits for room on the node, a copy of it that podstream cannot
// bind (its signature does not fit its name) stays Pending with a container ended `Error`, the
// reason Airflow's default does not exclude: it fails nothing, and try 1 succeeds once the
// real pod runs.

#[test]
fn podstream_airflow_3_1_pending_copy() {
    with_podstream(Airflow::line("3.1"), Story::PendingCopy);
}

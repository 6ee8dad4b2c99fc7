//! The seed stories on a real Kubernetes control plane: real Airflow 3.1 schedulers whose
//! kubernetes client talks to kube-apiserver (RBAC and admission on), `podstream kubelet` as
//! the node, once with the stock KubernetesExecutor and once with `PodstreamKubernetesExecutor`
//! beside `podstream run --collect-pods`; one story per seed, and trust's stories (j) and (k)
//! with podstream's executor. What each executor makes of each
//! story is the same as on the simulator (tests/tests/airflow/stock_airflow.rs and
//! podstream_stories.rs): the story outcomes do not hang on the simulator's own answers. The
//! audit log counts who deleted each pod: with podstream's collector every ended pod is deleted
//! by exactly one DELETE (no 404) and the schedulers send none; the stock count is printed, and
//! for both the seconds from each pod's end to its deletion.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::{Deleter, Executor, Kubernetes, RealAirflow};
use podstream_tests::stories::{
    PLANTED_COPY, Story, copy_refused, ended_right, heading, outcome, play_on,
};

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
    // The run can end before the scheduler has handled its pod's end: a fair count waits for
    // the pods to go, or for a while when stock leaves one.
    let settled = Instant::now() + Duration::from_secs(10);
    while !worker_pods(&real).is_empty() && Instant::now() < settled {
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "stock DELETEs per pod: {:?}",
        deletes_by(&real, Deleter::Scheduler)
    );
    println!(
        "stock seconds from a pod's end to its DELETE: {:?}",
        end_to_delete(&real, Deleter::Scheduler)
    );
    drop(real);

    let real = podstream_ends_right(story);
    every_ended_pod_deleted_once(&real);
    println!(
        "podstream seconds from a pod's end to its DELETE: {:?}",
        end_to_delete(&real, Deleter::Podstream)
    );
}

/// Plays `story` with podstream's executor on the real API server (Airflow 3.1); it must end
/// right, and a trust story's copy must have been refused.
fn podstream_ends_right(story: Story) -> RealAirflow {
    let airflow = Airflow::line("3.1");
    let (real, state) = play_on(airflow, Executor::Podstream, story, Kubernetes::Real);
    println!(
        "{}\n{}\n{}",
        heading(airflow, Executor::Podstream, story, &state),
        outcome(&real, &state),
        real.timeline()
    );
    if let Err(why) = ended_right(&real, &state, story).and_then(|()| copy_refused(&real, story)) {
        panic!("{why}\n{}", real.timeline());
    }
    real
}

/// Seconds from each pod's last status write by the kubelet (its end, for a pod that ran to
/// it) to `who`'s first DELETE of it: how long an ended pod stays. Printed for BENCHMARKS.md,
/// never asserted.
fn end_to_delete(real: &RealAirflow, who: Deleter) -> BTreeMap<String, f64> {
    let Some(plane) = real.control_plane() else {
        return BTreeMap::new();
    };
    let audit = plane.audit();
    let user = |d: Deleter| format!("system:serviceaccount:airflow:{}", d.account());
    let mut seconds = BTreeMap::new();
    let deletes = audit
        .iter()
        .filter(|r| r.verb == "delete" && r.resource == "pods" && r.user == user(who));
    for delete in deletes {
        let Some(deleted) = delete.at else {
            continue;
        };
        if seconds.contains_key(&delete.name) {
            continue;
        }
        let ended = audit
            .iter()
            .filter(|r| r.resource == "pods/status" && r.name == delete.name)
            .filter(|r| r.user == user(Deleter::Kubelet) && r.verb != "get")
            .filter_map(|r| r.at)
            .filter(|at| *at <= deleted)
            .max();
        if let Some(ended) = ended {
            seconds.insert(delete.name.clone(), (deleted - ended).as_seconds_f64());
        }
    }
    seconds
}

/// The names of the worker pods there now.
fn worker_pods(real: &RealAirflow) -> Vec<String> {
    real.pods()
        .iter()
        .filter(|p| p["metadata"]["namespace"] == "airflow")
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// The answers to `who`'s DELETEs, by pod.
fn deletes_by(real: &RealAirflow, who: Deleter) -> BTreeMap<String, Vec<u16>> {
    let mut deletes: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for (deleter, pod, code) in real.pod_deletes() {
        if deleter == who {
            deletes.entry(pod).or_default().push(code);
        }
    }
    deletes
}

/// With podstream's collector no worker pod is left once the story ended (the story's pods
/// succeed, and a losing duplicate goes after the grace period), each deleted by one DELETE
/// answered 200; the schedulers delete none.
fn every_ended_pod_deleted_once(real: &RealAirflow) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let left = worker_pods(real);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pods never collected: {left:?}\n{}\n{}",
            real.podstream_log(),
            real.timeline()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let collected = deletes_by(real, Deleter::Podstream);
    println!("podstream DELETEs per pod: {collected:?}");
    assert!(!collected.is_empty(), "the collector deleted the pods");
    for (pod, codes) in &collected {
        assert_eq!(
            codes,
            &[200],
            "{pod}: one DELETE, answered 200: {collected:?}"
        );
    }
    assert_eq!(
        deletes_by(real, Deleter::Scheduler),
        BTreeMap::new(),
        "the executor leaves the pods to the collector"
    );
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

/// Seed 002's sequel, apache/airflow#57553: the scheduler is killed, the task succeeds while
/// none runs, a new scheduler starts. Stock leaves the completed pod; the collector deletes
/// it once.
#[test]
fn succeeds_while_down_on_a_real_api_server() {
    let (_, callbacks) = Story::SucceedsWhileDown.right_ending(Airflow::line("3.1"));
    side_by_side(Story::SucceedsWhileDown, callbacks);
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

/// Trust, story (j): before the task's pod exists, a copy of it (the run's names, try 1, the
/// scheduler's job id) is created and succeeds at once. With signed pods it settles nothing:
/// the real pod's failure fails try 1 and try 2 succeeds, and the collector, though its
/// Role may delete pods, leaves the copy. Played with podstream's executor only: the stock
/// executor's answer is the simulator suite's (`stock_airflow_3_1_copy_first`).
#[test]
fn copy_first_on_a_real_api_server() {
    let real = podstream_ends_right(Story::CopyFirst);
    let deleted = deletes_by(&real, Deleter::Podstream);
    assert!(
        !deleted.contains_key(PLANTED_COPY),
        "the collector deleted the copy: {deleted:?}"
    );
    assert!(
        worker_pods(&real).iter().any(|name| name == PLANTED_COPY),
        "the copy is left where it was"
    );
}

/// Trust, story (k): while the task's pod waits for the node's one slot, a copy of it that
/// podstream cannot bind stays Pending with a container ended `Error` (the reason Airflow's
/// default does not exclude): it fails nothing, and try 1 succeeds once the real pod runs.
#[test]
fn pending_copy_on_a_real_api_server() {
    podstream_ends_right(Story::PendingCopy);
}

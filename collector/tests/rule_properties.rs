//! Over generated stories (the pods of one task instance's two tries, events in any order),
//! every command judged at any later point: no pod that drives a live try (one no later try
//! has superseded) is ever selected for deletion, and a losing duplicate or a stale pod is selected only as a candidate of its
//! task instance.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../rules/tests/support/mod.rs"]
mod events;
mod support;

use std::time::Duration;

use events::{EventExt, ev, ti};
use podstream_collector::rule::{Reason, Settings, Verdict, drives_a_live_try};
use podstream_proto::v1::{EventType, Phase, PodEvent};
use proptest::prelude::*;
use support::World;

fn phase() -> impl Strategy<Value = Phase> {
    prop_oneof![
        Just(Phase::Pending),
        Just(Phase::Running),
        Just(Phase::Succeeded),
        Just(Phase::Failed),
        Just(Phase::Unknown),
    ]
}

fn event_type() -> impl Strategy<Value = EventType> {
    prop_oneof![
        3 => Just(EventType::Modified),
        1 => Just(EventType::Added),
        1 => Just(EventType::Deleted),
    ]
}

/// Events of pods `a`, `b`, `c` (try 1) and `d` (try 2), with increasing resourceVersions.
fn story() -> impl Strategy<Value = Vec<PodEvent>> {
    prop::collection::vec(
        (0usize..4, event_type(), phase(), any::<bool>(), 0u8..6),
        1..30,
    )
    .prop_map(|steps| {
        steps
            .into_iter()
            .enumerate()
            .map(|(at, (pod, kind, phase, deleting, extra))| {
                let name = ["a", "b", "c", "d"][pod];
                let mut event = ev(kind, phase, name, at as u64 + 1).created(pod as i64 * 1_000);
                if pod == 3 {
                    event = event.with(|e| e.task = Some(ti(2)));
                }
                if deleting || kind == EventType::Deleted {
                    event = event.deleting();
                }
                match extra {
                    1 => event.reason("ProviderFailed"),
                    2 => event.app_waiting("ErrImagePull", "not found"),
                    3 => event.exited(1, "Error"),
                    _ => event,
                }
            })
            .collect()
    })
}

/// Whether a later try than `try_number` has run: then `try_number` is over, whatever its pods
/// show.
fn superseded(world: &World, try_number: i64) -> bool {
    world.commands.iter().any(|c| {
        c.task.as_ref().is_some_and(|t| t.try_number > try_number)
            && c.kind.as_ref().is_some_and(|k| k.name() == "running")
    })
}

fn settings(delete: bool, on_failure: bool) -> Settings {
    Settings {
        delete_worker_pods: delete,
        delete_worker_pods_on_failure: on_failure,
        grace: Duration::from_secs(60),
        live_pods: true,
        namespaces: Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_pod_that_drives_a_live_try_is_ever_deleted(
        story in story(),
        delete in any::<bool>(),
        on_failure in any::<bool>(),
        age in 0u64..120,
    ) {
        let settings = settings(delete, on_failure);
        let mut world = World::default();
        for event in &story {
            world.see(event);
            // Every command so far, judged now: a late redelivery reads the record as it is.
            for command in &world.commands {
                for verdict in world.judge(command, Duration::from_secs(age), &settings) {
                    let Verdict::Delete { pod, reason, .. } = &verdict else { continue };
                    let mut candidate_of_a_try = false;
                    for try_number in [1, 2] {
                        let Some(record) = world.record(&ti(try_number)) else { continue };
                        let Some(task) = record.task.as_ref() else { continue };
                        if let Some(candidate) = task.candidate(&pod.uid) {
                            candidate_of_a_try = true;
                            prop_assert!(
                                superseded(&world, try_number) || !drives_a_live_try(record, candidate),
                                "{:?} selects {} which drives try {}: {:?}", reason, pod.name, try_number, task
                            );
                        }
                    }
                    // Only an ending reported for it selects a pod the records no longer hold.
                    prop_assert!(candidate_of_a_try || *reason == Reason::Finished,
                        "{:?} selects {}, no candidate", reason, pod.name);
                }
            }
        }
    }
}

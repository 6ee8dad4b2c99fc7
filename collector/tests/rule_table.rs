//! The collection rules of docs/semantics.md ("Collecting worker pods") as a table: a story of
//! pod events decided by the processor's core, the command the collector looks at, the
//! settings and the command's age, and what the collector does to each pod.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../rules/tests/support/mod.rs"]
mod events;
mod support;

use std::time::Duration;

use events::{EventExt, ev, ti};
use podstream_collector::rule::Settings;
use podstream_proto::v1::EventType::{Added, Deleted, Modified};
use podstream_proto::v1::Phase::{Failed, Pending, Running, Succeeded};
use podstream_proto::v1::PodEvent;
use support::{World, line};

const GRACE: Duration = Duration::from_secs(60);

fn settings(delete: bool, on_failure: bool, live_pods: bool) -> Settings {
    Settings {
        delete_worker_pods: delete,
        delete_worker_pods_on_failure: on_failure,
        grace: GRACE,
        live_pods,
        namespaces: Vec::new(),
    }
}

/// `settings` that collect only in `namespaces` (the story's pods are in `airflow`).
fn only_in(namespaces: &[&str], settings: Settings) -> Settings {
    Settings {
        namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        ..settings
    }
}

/// Airflow's defaults: delete what succeeded, keep what failed; live pods never.
fn airflow_defaults() -> Settings {
    settings(true, false, false)
}

/// Pod `b` of try 2 (the story's relaunch after try 1).
fn try_2(
    kind: podstream_proto::v1::EventType,
    phase: podstream_proto::v1::Phase,
    name: &str,
    rv: u64,
) -> PodEvent {
    ev(kind, phase, name, rv).with(|e| e.task = Some(ti(2)))
}

/// Pod `a` runs and succeeds.
fn succeeded() -> Vec<PodEvent> {
    vec![ev(Added, Running, "a", 1), ev(Modified, Succeeded, "a", 2)]
}

/// Pod `a` runs and fails.
fn failed() -> Vec<PodEvent> {
    vec![
        ev(Added, Running, "a", 1),
        ev(Modified, Failed, "a", 2).exited(1, "Error"),
    ]
}

/// Seed 003: `a` runs; a second pod `b` for the same try starts, then fails.
fn seed_003() -> Vec<PodEvent> {
    vec![
        ev(Added, Running, "a", 1),
        ev(Added, Pending, "b", 2).created(5_000),
        ev(Modified, Failed, "b", 3)
            .created(5_000)
            .exited(1, "Error"),
    ]
}

/// Two live pods of one try: the newer, `b`, drives.
fn two_live_pods() -> Vec<PodEvent> {
    vec![
        ev(Added, Running, "a", 1),
        ev(Added, Running, "b", 2).created(5_000),
    ]
}

/// apache/airflow#69760 on Airflow 3: two live pods of one try, `a` launched for a task
/// instance UUID that a second scheduler's `b` made obsolete; `b` (newer) drives.
fn obsolete_uuid() -> Vec<PodEvent> {
    vec![
        ev(Added, Running, "a", 1).ti_id("0190a0a0-0000-7000-8000-00000000000a"),
        ev(Added, Running, "b", 2)
            .created(5_000)
            .ti_id("0190a0a0-0000-7000-8000-00000000000b"),
    ]
}

/// Try 1's pod `a` still runs when try 2's pod `c` runs.
fn try_2_runs() -> Vec<PodEvent> {
    vec![ev(Added, Running, "a", 1), try_2(Added, Running, "c", 2)]
}

/// One row: what happens, the story, the kind of command looked at, the settings, the
/// command's age, and the verdicts.
type Row = (
    &'static str,
    Vec<PodEvent>,
    &'static str,
    Settings,
    Duration,
    Vec<&'static str>,
);

#[test]
fn collection_table() {
    let seconds = Duration::from_secs;
    let rows: Vec<Row> = vec![
        (
            "a pod that succeeded is deleted at once",
            succeeded(),
            "completed",
            airflow_defaults(),
            seconds(0),
            vec!["delete a finished"],
        ),
        (
            "a pod that failed stays for inspection, as Airflow's default keeps it",
            failed(),
            "fail",
            airflow_defaults(),
            seconds(0),
            vec!["keep a failed_kept"],
        ),
        (
            "with delete_worker_pods_on_failure a failed pod is deleted",
            failed(),
            "fail",
            settings(true, true, false),
            seconds(0),
            vec!["delete a finished"],
        ),
        (
            "without delete_worker_pods an ended pod is labelled done",
            succeeded(),
            "completed",
            settings(false, true, false),
            seconds(0),
            vec!["label a"],
        ),
        (
            "a pod in a namespace the collector collects is deleted",
            succeeded(),
            "completed",
            only_in(&["airflow"], airflow_defaults()),
            seconds(0),
            vec!["delete a finished"],
        ),
        (
            "a pod in a namespace the collector does not collect is left",
            succeeded(),
            "completed",
            only_in(&["other"], airflow_defaults()),
            seconds(0),
            vec!["keep a elsewhere"],
        ),
        (
            "a pod fatally stuck in Pending is a failure like any other",
            vec![ev(Added, Pending, "a", 1).app_waiting("InvalidImageName", "bad")],
            "fail",
            settings(true, true, false),
            seconds(0),
            vec!["delete a finished"],
        ),
        (
            "a pod deleted while it ran is being deleted already: nothing to look at",
            vec![
                ev(Added, Running, "a", 1),
                ev(Deleted, Running, "a", 2).deleting(),
            ],
            "fail",
            settings(true, true, true),
            seconds(600),
            vec![],
        ),
        (
            "a finished pod that is gone by the time it is judged is left alone",
            vec![
                ev(Added, Running, "a", 1),
                ev(Modified, Succeeded, "a", 2),
                ev(Deleted, Succeeded, "a", 3).deleting(),
            ],
            "completed",
            airflow_defaults(),
            seconds(0),
            vec!["keep a gone"],
        ),
        (
            "seed 003: the second pod failed while the first drove; it waits out the grace period",
            seed_003(),
            "duplicate",
            airflow_defaults(),
            seconds(20),
            vec!["wait b duplicate 40s"],
        ),
        (
            "seed 003: after the grace period the loser is deleted, whatever the failure settings",
            seed_003(),
            "duplicate",
            airflow_defaults(),
            seconds(60),
            vec!["delete b duplicate for a"],
        ),
        (
            "a live loser is judged again until it ended, where a copy could win the order (no signed pods)",
            two_live_pods(),
            "duplicate",
            airflow_defaults(),
            seconds(600),
            vec!["wait a duplicate 60s"],
        ),
        (
            "with signed pods a live loser is deleted after the grace period, on its resourceVersion",
            two_live_pods(),
            "duplicate",
            settings(true, false, true),
            seconds(600),
            vec!["delete a duplicate rv 1 for b"],
        ),
        (
            "a live pod of an obsolete task-instance UUID is a losing duplicate, left live",
            obsolete_uuid(),
            "duplicate",
            airflow_defaults(),
            seconds(600),
            vec!["wait a duplicate 60s"],
        ),
        (
            "with signed pods the obsolete UUID's pod goes after the grace period",
            obsolete_uuid(),
            "duplicate",
            settings(true, false, true),
            seconds(600),
            vec!["delete a duplicate rv 1 for b"],
        ),
        (
            "a loser being deleted is left to that deletion",
            vec![
                ev(Added, Running, "a", 1),
                ev(Added, Running, "b", 2).created(5_000),
                ev(Modified, Running, "a", 3).deleting(),
            ],
            "duplicate",
            settings(true, false, true),
            seconds(600),
            vec!["keep a terminating"],
        ),
        (
            "a pod of a superseded try still alive is stale: deleted after the grace period",
            try_2_runs(),
            "running",
            settings(true, false, true),
            seconds(600),
            vec!["delete a stale rv 1 for c"],
        ),
        (
            "a stale pod waits out the grace period",
            try_2_runs(),
            "running",
            settings(true, false, true),
            seconds(15),
            vec!["wait a stale 45s"],
        ),
        (
            "a stale pod stays where a copy could claim a later try (no signed pods)",
            try_2_runs(),
            "running",
            airflow_defaults(),
            seconds(600),
            vec!["keep a live"],
        ),
        (
            "an ended pod of a superseded try is no stale pod: its ending collects it",
            vec![
                ev(Added, Running, "a", 1),
                ev(Modified, Failed, "a", 2).exited(1, "Error"),
                try_2(Added, Running, "c", 3),
            ],
            "running",
            settings(true, false, true),
            seconds(600),
            vec![],
        ),
    ];
    let mut failures = Vec::new();
    for (name, story, kind, settings, age, expected) in rows {
        let mut world = World::default();
        for event in &story {
            world.see(event);
        }
        let got: Vec<String> = world
            .judge(world.last(kind), age, &settings)
            .iter()
            .map(line)
            .collect();
        if got != expected {
            failures.push(format!(
                "{name}:\n  expected {expected:?}\n  got      {got:?}\n  commands {:?}",
                world
                    .commands
                    .iter()
                    .map(events::describe)
                    .collect::<Vec<_>>()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Seed 003 on Airflow's defaults: the second pod is judged while it still waits, then again
/// once it failed, and deleted then.
#[test]
fn a_live_loser_is_collected_once_it_has_ended() {
    let mut world = World::default();
    world.see(&ev(Added, Running, "a", 1));
    world.see(&ev(Added, Pending, "b", 2).created(5_000));
    let duplicate = world.last("duplicate").clone();
    let judged = |world: &World, age: u64| -> Vec<String> {
        world
            .judge(&duplicate, Duration::from_secs(age), &airflow_defaults())
            .iter()
            .map(line)
            .collect()
    };
    assert_eq!(judged(&world, 0), ["wait b duplicate 60s"]);
    assert_eq!(judged(&world, 60), ["wait b duplicate 60s"]);
    world.see(
        &ev(Modified, Failed, "b", 3)
            .created(5_000)
            .exited(1, "Error"),
    );
    assert_eq!(judged(&world, 120), ["delete b duplicate for a"]);
    assert!(
        world
            .commands
            .iter()
            .all(|c| c.pod.as_ref().unwrap().name == "a"
                || c.kind.as_ref().unwrap().name() == "duplicate"),
        "the loser's failure is not the task's: {:?}",
        world.commands
    );
}

/// A command judged again after the pod it names came to drive its try keeps it: the
/// verdict comes from the record as it is, never from the command alone.
#[test]
fn a_duplicate_command_judged_late_reads_the_record_as_it_is_now() {
    let mut world = World::default();
    world.see(&ev(Added, Running, "a", 1));
    world.see(&ev(Added, Running, "b", 2).created(5_000));
    let duplicate = world.last("duplicate").clone();
    let verdicts = |world: &World| -> Vec<String> {
        world
            .judge(
                &duplicate,
                Duration::from_secs(600),
                &settings(true, false, true),
            )
            .iter()
            .map(line)
            .collect()
    };
    assert_eq!(verdicts(&world), ["delete a duplicate rv 1 for b"]);
    // The chosen pod is deleted by someone; `a` drives from then on.
    world.see(&ev(Modified, Running, "b", 3).created(5_000).deleting());
    assert_eq!(verdicts(&world), ["keep a drives"]);
}

//! docs/semantics.md beyond one event: order and repeats, ownership, several pods
//! for one task instance. Each case is a story of events and the commands it
//! must produce, in order.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use podstream_proto::v1::EventType::{Added, Deleted, Modified};
use podstream_proto::v1::Phase::{Failed, Pending, Running, Succeeded};
use support::{EventExt, ev, run, run_with, signed_rules, ti};

/// A UUID no TI has: what a copy of a TI's annotations may claim.
const FORGED: &str = "0196b3a0-0000-7000-8000-00000000f04d";
const REAL: &str = "0196b3a0-0000-7000-8000-000000000001";

/// `--require-signed-pods`: a pod the executor did not sign is never a candidate, whatever
/// its order against the real pod.
#[test]
fn signed_stories() {
    #[rustfmt::skip]
    let stories: Vec<(&str, Vec<_>, Vec<&str>)> = vec![
        ("a copy made before the real pod, succeeding at once, settles nothing",
            vec![ev(Added, Pending, "f", 1).created(1_000), ev(Modified, Succeeded, "f", 2).created(1_000),
                 ev(Added, Pending, "a", 3).created(2_000).signed(), ev(Modified, Running, "a", 4).created(2_000).signed(),
                 ev(Modified, Failed, "a", 5).created(2_000).signed()],
            vec!["running a 1", "fail a 1 pod_failed"]),
        ("a copy carrying the real pod's signature under its own name is foreign too",
            vec![ev(Added, Pending, "a", 1).created(1_000).signed(),
                 ev(Added, Pending, "f", 2).created(2_000).signature_of("a").app_waiting("ErrImagePull", "x"),
                 ev(Modified, Running, "a", 3).created(1_000).signed(), ev(Modified, Succeeded, "a", 4).created(1_000).signed()],
            vec!["running a 1", "completed a 1"]),
        ("a newer running copy relabelled to another scheduler neither transfers nor takes the choice",
            vec![ev(Added, Running, "a", 1).created(1_000).signed(), ev(Added, Running, "f", 2).created(2_000),
                 ev(Modified, Running, "f", 3).created(2_000).owner("2"), ev(Modified, Failed, "a", 4).created(1_000).signed()],
            vec!["running a 1", "fail a 1 pod_failed"]),
        ("the executor's relaunch is signed too and drives the try",
            vec![ev(Added, Pending, "b", 1).signed().app_waiting("ErrImagePull", "no such image"),
                 ev(Added, Pending, "a", 2).signed(), ev(Modified, Running, "a", 3).signed()],
            vec!["fail b 1 fatal_pending:ErrImagePull", "running a 1"]),
    ];
    for (story, events, expected) in stories {
        assert_eq!(run_with(signed_rules(), &events), expected, "{story}");
    }
}

#[test]
fn stories() {
    #[rustfmt::skip]
    let stories: Vec<(&str, Vec<_>, Vec<&str>)> = vec![
        ("a pod's life: pending, running, succeeded",
            vec![ev(Added, Pending, "a", 1), ev(Modified, Running, "a", 2), ev(Modified, Succeeded, "a", 3)],
            vec!["running a 1", "completed a 1"]),
        ("the same event twice emits once",
            vec![ev(Modified, Running, "a", 2), ev(Modified, Running, "a", 2)],
            vec!["running a 1"]),
        ("an older event after a newer one changes nothing",
            vec![ev(Modified, Succeeded, "a", 5), ev(Modified, Running, "a", 4)],
            vec!["completed a 1"]),
        ("resourceVersions compare as integers",
            vec![ev(Modified, Running, "a", 9), ev(Modified, Failed, "a", 10)],
            vec!["running a 1", "fail a 1 pod_failed"]),
        ("a newer event with the same facts emits nothing",
            vec![ev(Modified, Running, "a", 2), ev(Modified, Running, "a", 3), ev(Modified, Running, "a", 4)],
            vec!["running a 1"]),
        ("a pod fails its task once",
            vec![ev(Modified, Pending, "a", 1).app_waiting("ErrImagePull", "no such image"),
                 ev(Modified, Failed, "a", 2), ev(Deleted, Failed, "a", 3).deleting()],
            vec!["fail a 1 fatal_pending:ErrImagePull"]),
        ("seed 000: a relabel is a transfer, never a fail",
            vec![ev(Modified, Running, "a", 2), ev(Modified, Running, "a", 3).owner("2"),
                 ev(Modified, Succeeded, "a", 4).owner("2")],
            vec!["running a 1", "transfer a 2 1->2", "completed a 2"]),
        ("a relabel away and back is two transfers",
            vec![ev(Modified, Running, "a", 2), ev(Modified, Running, "a", 3).owner("2"),
                 ev(Modified, Running, "a", 4).owner("1")],
            vec!["running a 1", "transfer a 2 1->2", "transfer a 1 2->1"]),
        ("leaving the selector never fails, and the pod is gone",
            vec![ev(Modified, Running, "a", 2), ev(Deleted, Running, "a", 3)],
            vec!["running a 1"]),
        ("graceful delete of a running pod: terminating, then deleted",
            vec![ev(Modified, Running, "a", 2), ev(Modified, Running, "a", 3).deleting(),
                 ev(Deleted, Running, "a", 4).deleting()],
            vec!["running a 1", "fail a 1 deleted_while_running"]),
        ("a pending pod deleted is lost, not failed",
            vec![ev(Added, Pending, "a", 1), ev(Deleted, Pending, "a", 2).deleting()],
            vec!["lost a 1 deleted_while_pending"]),
        ("revoked pods change nothing, not even by a relabel",
            vec![ev(Modified, Running, "a", 2), ev(Modified, Running, "a", 3).owner("2").revoked(),
                 ev(Deleted, Running, "a", 4).deleting().revoked()],
            vec!["running a 1"]),
        ("done pods change nothing",
            vec![ev(Modified, Succeeded, "a", 2).done(), ev(Deleted, Succeeded, "a", 3).deleting().done()],
            vec![]),
        ("seed 003: older running pod beats newer pending one; the loser's failure fails nothing",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Pending, "b", 2).created(2_000),
                 ev(Modified, Failed, "b", 3).created(2_000)],
            vec!["running a 1", "duplicate b 1 chosen=a others=b"]),
        ("duplicates: newest creation wins among equals, then the last name",
            vec![ev(Added, Pending, "a", 1).created(1_000), ev(Added, Pending, "b", 2).created(2_000),
                 ev(Added, Pending, "c", 3).created(2_000)],
            vec!["duplicate b 1 chosen=b others=a", "duplicate c 1 chosen=c others=b,a"]),
        ("duplicates: a terminating pod yields to a live one, whose outcome is reported",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Running, "b", 2).created(500),
                 ev(Modified, Running, "a", 3).created(1_000).deleting()],
            vec!["running a 1", "duplicate b 1 chosen=a others=b", "running b 1",
                 "duplicate a 1 chosen=b others=a"]),
        ("duplicates: once the chosen pod ended the try, a loser's failure stays silent",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Pending, "b", 2).created(2_000),
                 ev(Modified, Failed, "b", 3).created(2_000), ev(Modified, Succeeded, "a", 4).created(1_000),
                 ev(Deleted, Succeeded, "a", 5).created(1_000).deleting()],
            vec!["running a 1", "duplicate b 1 chosen=a others=b", "completed a 1"]),
        ("duplicates: the last duplicate gone, a new record is made if another appears",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Pending, "b", 2).created(2_000),
                 ev(Deleted, Pending, "b", 3).created(2_000).deleting(), ev(Added, Pending, "c", 4).created(3_000)],
            vec!["running a 1", "duplicate b 1 chosen=a others=b", "duplicate c 1 chosen=a others=c"]),
        ("a loser's relabel is not a transfer; the chosen pod's is",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Pending, "b", 2).created(2_000),
                 ev(Modified, Pending, "b", 3).created(2_000).owner("2"),
                 ev(Modified, Running, "a", 4).created(1_000).owner("2")],
            vec!["running a 1", "duplicate b 1 chosen=a others=b", "transfer a 2 1->2"]),
        ("the executor's relaunch of a pod that failed before its task started drives the try",
            vec![ev(Added, Pending, "b", 1).app_waiting("ErrImagePull", "no such image"),
                 ev(Added, Pending, "a", 2), ev(Modified, Pending, "a", 3).app_waiting("ErrImagePull", "no such image")],
            vec!["fail b 1 fatal_pending:ErrImagePull", "fail a 1 fatal_pending:ErrImagePull"]),
        ("a relaunch that runs reports running, the first pod's later events stay silent",
            vec![ev(Modified, Failed, "b", 1).created(1_000), ev(Added, Running, "a", 2).created(1_000),
                 ev(Deleted, Failed, "b", 3).created(1_000).deleting(), ev(Modified, Succeeded, "a", 4).created(1_000)],
            vec!["fail b 1 pod_failed", "running a 1", "completed a 1"]),
        ("a pod new to a completed try that is already over is a duplicate whose failure fails nothing",
            vec![ev(Modified, Succeeded, "a", 1), ev(Added, Failed, "b", 2)],
            vec!["completed a 1", "duplicate b 1 chosen=a others=b"]),
        ("no try muted by a copy: one that completes before the real pod exists silences nothing",
            vec![ev(Added, Pending, "f", 1).created(1_000), ev(Modified, Succeeded, "f", 2).created(1_000),
                 ev(Added, Pending, "a", 3).created(2_000), ev(Modified, Running, "a", 4).created(2_000),
                 ev(Modified, Failed, "a", 5).created(2_000), ev(Deleted, Succeeded, "f", 6).created(1_000).deleting()],
            vec!["completed f 1", "running a 1", "fail a 1 pod_failed"]),
        ("no try muted by a copy: one that completes while the real pod is pending silences nothing",
            vec![ev(Added, Pending, "a", 1).created(1_000), ev(Added, Pending, "f", 2).created(2_000),
                 ev(Modified, Succeeded, "f", 3).created(2_000), ev(Modified, Running, "a", 4).created(1_000),
                 ev(Modified, Failed, "a", 5).created(1_000)],
            vec!["duplicate f 1 chosen=f others=a", "duplicate f 1 chosen=a others=f", "running a 1",
                 "fail a 1 pod_failed"]),
        ("no try muted by a copy: one that completes while the real pod runs silences nothing",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Pending, "f", 2).created(2_000),
                 ev(Modified, Succeeded, "f", 3).created(2_000), ev(Modified, Failed, "a", 4).created(1_000)],
            vec!["running a 1", "duplicate f 1 chosen=a others=f", "fail a 1 pod_failed"]),
        ("a copy that appears after the real pod completed is reported, for its consumer to refuse",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Modified, Succeeded, "a", 2).created(1_000),
                 ev(Added, Running, "f", 3).created(2_000), ev(Modified, Failed, "f", 4).created(2_000)],
            vec!["running a 1", "completed a 1", "running f 1", "fail f 1 pod_failed"]),
        ("trust: a copy that fails while the real pod runs fails nothing; the real pod's failure does",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Running, "f", 2).created(2_000),
                 ev(Modified, Failed, "f", 3).created(2_000), ev(Modified, Failed, "a", 4).created(1_000)],
            vec!["running a 1", "running f 1", "duplicate f 1 chosen=f others=a",
                 "duplicate f 1 chosen=a others=f", "fail a 1 pod_failed"]),
        ("trust: a copy claiming a UUID shares the record and competes the same way",
            vec![ev(Added, Running, "a", 1).created(1_000),
                 ev(Added, Running, "f", 2).created(2_000).ti_id(FORGED),
                 ev(Modified, Failed, "f", 3).created(2_000).ti_id(FORGED),
                 ev(Modified, Failed, "a", 4).created(1_000)],
            vec!["running a 1", "running f 1", "duplicate f 1 chosen=f others=a",
                 "duplicate f 1 chosen=a others=f", "fail a 1 pod_failed"]),
        ("trust: a copy that succeeds early is passed over too",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Pending, "f", 2).created(2_000),
                 ev(Modified, Succeeded, "f", 3).created(2_000), ev(Modified, Failed, "a", 4).created(1_000)],
            vec!["running a 1", "duplicate f 1 chosen=a others=f", "fail a 1 pod_failed"]),
        ("an outcome follows the task: a pod that failed while its scheduler was away, then adopted",
            vec![ev(Modified, Running, "a", 1), ev(Modified, Failed, "a", 2),
                 ev(Modified, Failed, "a", 3).owner("2")],
            vec!["running a 1", "fail a 1 pod_failed", "transfer a 2 1->2", "fail a 2 pod_failed"]),
        ("an outcome follows the task: a completed pod adopted",
            vec![ev(Modified, Succeeded, "a", 1), ev(Modified, Succeeded, "a", 2).owner("2")],
            vec!["completed a 1", "transfer a 2 1->2", "completed a 2"]),
        ("an outcome follows the task each time it moves, and a repeat of the move emits nothing",
            vec![ev(Modified, Failed, "a", 1), ev(Modified, Failed, "a", 2).owner("2"),
                 ev(Modified, Failed, "a", 2).owner("2"), ev(Modified, Failed, "a", 3).owner("3")],
            vec!["fail a 1 pod_failed", "transfer a 2 1->2", "fail a 2 pod_failed",
                 "transfer a 3 2->3", "fail a 3 pod_failed"]),
        ("a loser's ending does not follow a relabel: it was never the task's",
            vec![ev(Added, Running, "a", 1).created(1_000), ev(Added, Running, "b", 2).created(500),
                 ev(Modified, Failed, "b", 3).created(500), ev(Modified, Failed, "b", 4).created(500).owner("2")],
            vec!["running a 1", "duplicate b 1 chosen=a others=b"]),
        ("pods of different tries are different task instances",
            vec![ev(Modified, Failed, "a", 1), ev(Added, Running, "b", 2).with(|e| e.task = Some(ti(2)))],
            vec!["fail a 1 pod_failed", "running b 1"]),
    ];
    let mut wrong = Vec::new();
    for (story, events, expected) in stories {
        let got = run(&events);
        if got != expected {
            wrong.push(format!(
                "{story}:\n  expected {expected:?}\n  got      {got:?}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "stories that disagree with semantics.md:\n{}",
        wrong.join("\n")
    );
}

/// A command carries the UUID of the pod it reports for, which the sink checks against the TI:
/// when the choice moves to another pod, its command names that pod's UUID, not the UUID of
/// the pod whose event moved it.
#[test]
fn a_command_names_the_uuid_of_the_pod_it_reports_for() {
    use podstream_rules::{MemoryStore, Processor, Rules};
    let mut processor = Processor::new(Rules::default(), MemoryStore::default());
    let events = [
        ev(Added, Running, "a", 1).created(1_000).ti_id(REAL),
        ev(Added, Running, "b", 2).created(500).ti_id(FORGED),
        ev(Modified, Running, "a", 3)
            .created(1_000)
            .ti_id(REAL)
            .deleting(),
    ];
    let mut reported = Vec::new();
    for event in &events {
        for command in processor.handle(event).unwrap() {
            let command = command.into_command();
            let kind = command.kind.as_ref().map_or("none", |k| k.name());
            let pod = command
                .pod
                .as_ref()
                .map_or("", |p| p.name.as_str())
                .to_owned();
            let uuid = command.task.map(|t| t.task_instance_id).unwrap_or_default();
            reported.push((kind, pod, uuid));
        }
    }
    let running = |pod: &str, uuid: &str| ("running", pod.to_owned(), uuid.to_owned());
    let duplicate = |pod: &str, uuid: &str| ("duplicate", pod.to_owned(), uuid.to_owned());
    assert_eq!(
        reported,
        [
            running("a", REAL),
            duplicate("b", FORGED),
            running("b", FORGED),
            duplicate("a", REAL),
        ]
    );
    assert_eq!(processor.store().records(), 1, "one record for both pods");
}

#[test]
fn command_ids_are_deterministic_and_distinct() {
    let events = [
        ev(Modified, Running, "a", 2),
        ev(Modified, Running, "a", 3).owner("2"),
        ev(Modified, Failed, "a", 4).owner("2"),
    ];
    let ids = |events: &[_]| {
        let mut p = podstream_rules::Processor::new(
            Default::default(),
            podstream_rules::MemoryStore::default(),
        );
        events
            .iter()
            .flat_map(|e| p.handle(e).unwrap())
            .map(|c| c.id())
            .collect::<Vec<_>>()
    };
    let first = ids(&events);
    assert_eq!(first, ids(&events));
    assert_eq!(
        first,
        ["uid-a:2:running", "uid-a:3:transfer", "uid-a:4:fail"]
    );
}

#[test]
fn malformed_events_are_typed_errors() {
    let mut p = podstream_rules::Processor::new(
        Default::default(),
        podstream_rules::MemoryStore::default(),
    );
    let no_pod = ev(Modified, Running, "a", 1).with(|e| e.pod = None);
    let no_task = ev(Modified, Running, "a", 1).with(|e| e.task = None);
    assert!(matches!(
        p.handle(&no_pod),
        Err(podstream_rules::HandleError::Event(
            podstream_rules::EventError::NoPod
        ))
    ));
    assert!(matches!(
        p.handle(&no_task),
        Err(podstream_rules::HandleError::Event(
            podstream_rules::EventError::NoTask
        ))
    ));
}

/// The in-process store forgets finished task instances (every pod deleted) beyond its
/// limit, oldest first, and never a live one: memory follows the live task instances.
#[test]
fn finished_task_instances_are_forgotten_beyond_the_limit_and_live_ones_never() {
    use podstream_rules::{MemoryStore, Processor, Rules};
    let mut processor = Processor::new(Rules::default(), MemoryStore::keeping_finished(3));
    let of = |task: &str, event: podstream_proto::v1::PodEvent| podstream_proto::v1::PodEvent {
        task: Some(podstream_proto::v1::TaskKey {
            task_id: task.into(),
            ..ti(1)
        }),
        ..event
    };
    let live = |name: &str| of(name, ev(Added, Running, name, 1));
    processor.handle(&live("stays")).unwrap();
    for i in 0..10 {
        let name = format!("done-{i}");
        processor
            .handle(&of(&name, ev(Added, Running, &name, 10 + i)))
            .unwrap();
        processor
            .handle(&of(&name, ev(Deleted, Succeeded, &name, 20 + i).deleting()))
            .unwrap();
    }
    assert_eq!(
        processor.store().records(),
        1 + 3,
        "the live one and the last three finished"
    );
    let stays = podstream_proto::v1::TaskKey {
        task_id: "stays".into(),
        ..ti(1)
    };
    assert!(
        processor.store().task(&stays).is_some(),
        "a live TI is never forgotten"
    );
    // A late repeat of a kept finished TI's event changes nothing; a forgotten one is
    // decided again (same command ids: the sink skips them).
    let repeat = of("done-9", ev(Deleted, Succeeded, "done-9", 29).deleting());
    let kept = processor.handle(&repeat).unwrap();
    assert!(kept.is_empty(), "{kept:?}");
}

/// Thousands of copies of a pod keep a task's record and its commands bounded: a duplicate
/// names the 32 most preferred others and counts the rest, and a record keeps the newest 16
/// deleted pods' tombstones besides its live pods.
#[test]
fn copies_by_the_hundred_keep_the_record_and_the_commands_bounded() {
    use podstream_proto::v1::command::Kind;
    use podstream_rules::decide::MAX_DUPLICATE_OTHERS;
    use podstream_rules::record::{MAX_TOMBSTONES, TaskRecord};

    let rules = podstream_rules::Rules::default();
    let mut record = TaskRecord::default();
    let mut sequence = 0;
    let mut decide = |record: &mut TaskRecord, event| {
        sequence += 1;
        record.apply(&rules, &event, sequence).unwrap()
    };
    decide(&mut record, ev(Added, Running, "real", 1).created(1));
    let mut last_duplicate = None;
    for n in 0..100u64 {
        let copy = format!("copy-{n:03}");
        let commands = decide(&mut record, ev(Added, Pending, &copy, 2 + n).created(2));
        if let Some(Kind::Duplicate(d)) = commands.into_iter().find_map(|c| c.kind) {
            last_duplicate = Some(d);
        }
    }
    let duplicate = last_duplicate.expect("a duplicate record");
    assert_eq!(duplicate.chosen.unwrap().name, "real");
    assert_eq!(duplicate.others.len(), MAX_DUPLICATE_OTHERS);
    assert_eq!(
        duplicate.others_left_out as usize,
        100 - MAX_DUPLICATE_OTHERS
    );
    assert!(record.encode().unwrap().len() < 256 * 1024);

    for n in 0..100u64 {
        let copy = format!("copy-{n:03}");
        decide(
            &mut record,
            ev(Deleted, Pending, &copy, 200 + n).created(2).deleting(),
        );
    }
    assert_eq!(
        record.pods.len(),
        1 + MAX_TOMBSTONES,
        "the live pod and the newest tombstones"
    );
    assert!(record.pod("uid-real").is_some_and(|p| !p.state.gone));
    assert!(
        record.pod("uid-copy-099").is_some(),
        "the newest tombstone stays"
    );
    assert!(record.pod("uid-copy-000").is_none(), "the oldest goes");
    // A late repeat of a kept tombstone's event is still stale.
    assert!(
        decide(
            &mut record,
            ev(Deleted, Pending, "copy-099", 299).created(2).deleting()
        )
        .is_empty()
    );
}

//! Properties of the core over generated stories: determinism of the
//! duplicate choice, idempotence under redelivery and replay, no panics.

// Test code: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use podstream_proto::v1::{EventType, Phase, PodEvent, PodRef, TaskKey};
use podstream_rules::duplicates::choose;
use podstream_rules::record::TaskRecord;
use podstream_rules::{MemoryStore, Processor, Rules};
use proptest::prelude::*;
use support::{EventExt, describe, ev, run, ti};

fn phase() -> impl Strategy<Value = Phase> {
    prop_oneof![
        Just(Phase::Pending),
        Just(Phase::Running),
        Just(Phase::Succeeded),
        Just(Phase::Failed),
        Just(Phase::Unknown),
        Just(Phase::Unspecified)
    ]
}

fn event_type() -> impl Strategy<Value = EventType> {
    prop_oneof![
        Just(EventType::Added),
        Just(EventType::Modified),
        Just(EventType::Deleted)
    ]
}

/// One pod's facts for a duplicate set: (phase, terminating, created second, name).
fn pod_facts() -> impl Strategy<Value = (Phase, bool, i64, String)> {
    (phase(), any::<bool>(), 0i64..4, "[a-c]{1,2}")
}

/// A story: events of up to three pods of one TI, with globally increasing
/// resourceVersions, as etcd gives them.
fn story() -> impl Strategy<Value = Vec<PodEvent>> {
    prop::collection::vec(
        (
            0usize..3,
            event_type(),
            phase(),
            any::<bool>(),
            prop_oneof![Just("1"), Just("2")],
            any::<bool>(),
            0u8..8,
        ),
        1..25,
    )
    .prop_map(|steps| {
        steps
            .into_iter()
            .enumerate()
            .map(
                |(at, (pod, kind, phase, deleting, owner, revoked, extra))| {
                    let name = ["a", "b", "c"][pod];
                    let mut event = ev(kind, phase, name, at as u64 + 1)
                        .owner(owner)
                        .created(pod as i64 * 1_000);
                    if deleting {
                        event = event.deleting();
                    }
                    if revoked && extra == 0 {
                        event = event.revoked();
                    }
                    match extra {
                        1 => event.reason("ProviderFailed"),
                        2 => event.app_waiting("ErrImagePull", "not found"),
                        3 => event.synthesized(),
                        _ => event,
                    }
                },
            )
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever order the pods of one TI are seen in, the same pod is chosen.
    #[test]
    fn duplicate_choice_ignores_arrival_order(
        pods in prop::collection::vec(pod_facts(), 2..6),
        order in Just(()).prop_perturb(|_, mut rng| rng.random::<u64>()),
    ) {
        let events: Vec<PodEvent> = pods.iter().enumerate().map(|(i, (phase, terminating, created, name))| {
            let mut e = ev(EventType::Added, *phase, &format!("{name}{i}"), 1).created(*created * 1_000);
            if *terminating { e = e.deleting(); }
            e
        }).collect();
        let mut shuffled = events.clone();
        // A deterministic permutation from the seed: rotate and reverse.
        let rotate = (order as usize) % shuffled.len();
        shuffled.rotate_left(rotate);
        if order % 2 == 1 { shuffled.reverse(); }

        let chosen = |events: &[PodEvent]| {
            let mut processor = Processor::new(Rules::default(), MemoryStore::default());
            for e in events { processor.handle(e).unwrap(); }
            let task = processor.store().task(&ti(1)).cloned().unwrap();
            task.candidates[choose(&task.candidates).unwrap()].pod.uid.clone()
        };
        prop_assert_eq!(chosen(&events), chosen(&shuffled));
    }

    /// Redelivering any earlier event at any later point changes nothing:
    /// it is either the pod's last event again or older than it.
    #[test]
    fn redelivery_and_replay_change_nothing(
        events in story(),
        copies in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..10),
    ) {
        let baseline = run(&events);
        let mut redelivered: Vec<PodEvent> = events.clone();
        for (original, after) in copies {
            let original = original.index(events.len());
            // Insert a copy of event `original` somewhere after its first delivery.
            let first = redelivered.iter().position(|e| *e == events[original]).unwrap();
            let at = first + 1 + after.index(redelivered.len() - first);
            redelivered.insert(at, events[original].clone());
        }
        prop_assert_eq!(run(&redelivered), baseline);
    }

    /// The service's record, fed each event at its stream sequence and then any earlier
    /// event again at its own (a redelivery the per-pod sequence recognises), emits what the
    /// in-process shell emits for the story, and its TI ends in the same state.
    #[test]
    fn the_records_apply_is_the_shells_decision(
        events in story(),
        redeliveries in prop::collection::vec(any::<prop::sample::Index>(), 0..5),
    ) {
        let mut record = TaskRecord::default();
        let mut applied = Vec::new();
        for (at, event) in events.iter().enumerate() {
            let sequence = at as u64 + 1;
            applied.extend(record.apply(&Rules::default(), event, sequence).unwrap().iter().map(describe));
            for again in &redeliveries {
                let earlier = again.index(at + 1);
                let repeated = record.apply(&Rules::default(), &events[earlier], earlier as u64 + 1).unwrap();
                prop_assert!(repeated.is_empty(), "a redelivery emitted {repeated:?}");
            }
        }
        prop_assert_eq!(&applied, &run(&events));
        let mut processor = Processor::new(Rules::default(), MemoryStore::default());
        for event in &events {
            processor.handle(event).unwrap();
        }
        prop_assert_eq!(record.task.as_ref(), processor.store().task(&ti(1)));
    }

    /// Replaying a whole story into the state it left emits nothing.
    #[test]
    fn replaying_a_story_emits_nothing(events in story()) {
        let mut processor = Processor::new(Rules::default(), MemoryStore::default());
        for e in &events { processor.handle(e).unwrap(); }
        for e in &events {
            prop_assert!(processor.handle(e).unwrap().is_empty());
        }
    }

    /// Arbitrary, even malformed, events never panic the core.
    #[test]
    fn no_panic_on_arbitrary_events(
        events in prop::collection::vec((
            any::<i32>(), any::<i32>(), any::<Option<String>>(), any::<Option<(String, i64, i64)>>(),
            any::<String>(), any::<String>(), any::<Option<i64>>(), any::<i64>(), any::<bool>(), any::<bool>(),
        ), 1..20),
    ) {
        let mut processor = Processor::new(Rules::default(), MemoryStore::default());
        for (kind, phase, uid, task, owner, rv, deletion, created, revoked, done) in events {
            let event = PodEvent {
                r#type: kind,
                phase,
                pod: uid.map(|uid| PodRef { namespace: "ns".into(), name: uid.clone(), uid }),
                task: task.map(|(dag, map_index, try_number)| TaskKey {
                    dag_id: dag, task_id: "t".into(), run_id: "r".into(), map_index, try_number, logical_date: String::new(), task_instance_id: String::new(),
                }),
                owner, resource_version: rv, deletion_unix_ms: deletion, creation_unix_ms: created,
                revoked, executor_done: done,
                ..PodEvent::default()
            };
            let _ = processor.handle(&event);
        }
    }
}

#[test]
fn precedence_is_a_total_order_over_distinct_pods() {
    // Two pods equal in every fact but the uid: the last uid wins, both ways.
    let a = ev(EventType::Added, Phase::Running, "same", 1);
    let b = ev(EventType::Added, Phase::Running, "same", 2).with(|e| {
        e.pod = Some(PodRef {
            namespace: "airflow".into(),
            name: "same".into(),
            uid: "uid-zzz".into(),
        })
    });
    for events in [[a.clone(), b.clone()], [b, a]] {
        let mut processor = Processor::new(Rules::default(), MemoryStore::default());
        for e in &events {
            processor.handle(e).unwrap();
        }
        let task = processor.store().task(&ti(1)).cloned().unwrap();
        assert_eq!(
            task.candidates[choose(&task.candidates).unwrap()].pod.uid,
            "uid-zzz"
        );
    }
}

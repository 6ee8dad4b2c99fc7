//! The ingest's pure core, as a table: what is published for each observed pod event.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use podstream_ingest::known::{KnownPods, Role, Sighting};
use podstream_proto::subject::Subjects;
use podstream_proto::v1::{EventType, Phase};
use podstream_proto::{PodEvent, PodRef};

fn event(uid: &str, namespace: &str, owner: &str, rv: u64, kind: EventType) -> PodEvent {
    let mut event = PodEvent {
        pod: Some(PodRef {
            uid: uid.into(),
            namespace: namespace.into(),
            name: format!("pod-{uid}"),
        }),
        owner: owner.into(),
        resource_version: rv.to_string(),
        ..PodEvent::default()
    };
    event.set_type(kind);
    event.set_phase(Phase::Running);
    event
}

/// (subject, msg id, role, type) of what one observation publishes.
type Published = Vec<(String, String, Role, EventType)>;

fn observe(known: &mut KnownPods, event: PodEvent) -> Published {
    let subjects = Subjects::new("podstream").unwrap();
    known
        .observe(&subjects, event, Sighting::Listing)
        .into_iter()
        .map(|out| (out.subject, out.msg_id, out.role, out.event.r#type()))
        .collect()
}

fn one(
    subject: &str,
    msg_id: &str,
    role: Role,
    kind: EventType,
) -> (String, String, Role, EventType) {
    (subject.into(), msg_id.into(), role, kind)
}

#[test]
fn what_each_observation_publishes() {
    use EventType::{Added, Deleted, Modified};
    let mut known = KnownPods::new();
    // (what is seen, what is published), in order, on one ingest.
    let table: Vec<(PodEvent, Published)> = vec![
        // A new pod: ADDED on its owner's subject, whatever the watch called it.
        (
            event("a", "airflow", "1", 10, Modified),
            vec![one(
                "podstream.pods.1.a",
                "a:10:changed",
                Role::Event,
                Added,
            )],
        ),
        // The same revision again (a re-list, a replay, a restart): nothing.
        (event("a", "airflow", "1", 10, Added), vec![]),
        // An older revision (the replay overlapping the watch): nothing.
        (event("a", "airflow", "1", 9, Modified), vec![]),
        // A newer revision: MODIFIED.
        (
            event("a", "airflow", "1", 12, Added),
            vec![one(
                "podstream.pods.1.a",
                "a:12:changed",
                Role::Event,
                Modified,
            )],
        ),
        // A relabel 1 → 2: the event on 2's subject, the notice on 1's.
        (
            event("a", "airflow", "2", 15, Modified),
            vec![
                one("podstream.pods.2.a", "a:15:changed", Role::Event, Modified),
                one(
                    "podstream.pods.1.a",
                    "a:15:changed:left",
                    Role::Left,
                    Modified,
                ),
            ],
        ),
        // Deleted: DELETED on the current owner's subject.
        (
            event("a", "airflow", "2", 20, Deleted),
            vec![one(
                "podstream.pods.2.a",
                "a:20:deleted",
                Role::Event,
                Deleted,
            )],
        ),
        // A late copy of the delete, or an older change after it: nothing.
        (event("a", "airflow", "2", 20, Deleted), vec![]),
        (event("a", "airflow", "2", 18, Modified), vec![]),
        // Owners that are not plain tokens are encoded.
        (
            event("b", "airflow", "job.7 *", 30, Added),
            vec![one(
                "podstream.pods.job~2E7~20~2A.b",
                "b:30:changed",
                Role::Event,
                Added,
            )],
        ),
    ];
    for (n, (seen, expected)) in table.into_iter().enumerate() {
        let published = observe(&mut known, seen.clone());
        assert_eq!(published, expected, "row {n}: {seen:?}");
    }
}

#[test]
fn a_list_without_a_known_pod_synthesizes_its_delete_in_scope_only() {
    let subjects = Subjects::new("podstream").unwrap();
    let mut known = KnownPods::from_events([
        event("listed", "airflow", "1", 5, EventType::Modified),
        event("gone", "airflow", "3", 7, EventType::Modified),
        event("elsewhere", "other", "1", 8, EventType::Modified),
    ]);
    let listed: HashSet<String> = ["listed".to_owned()].into();
    let out = known.vanished(&subjects, Some("airflow"), &listed);
    assert_eq!(
        out.len(),
        1,
        "only the unlisted pod of the listed namespace"
    );
    let delete = &out[0];
    assert_eq!(delete.subject, "podstream.pods.3.gone");
    assert_eq!(delete.event.r#type(), EventType::Deleted);
    assert!(delete.event.synthesized);
    assert_eq!(
        delete.event.resource_version, "8",
        "one past its last revision: newer for the rules"
    );
    assert_eq!(
        delete.event.phase(),
        Phase::Running,
        "the last facts are kept: a running pod that vanished"
    );
    assert!(known.get("gone").is_none() && known.get("elsewhere").is_some());
    // Listing again changes nothing more.
    assert!(
        known
            .vanished(&subjects, Some("airflow"), &listed)
            .is_empty()
    );
    // A whole-cluster list without "elsewhere" synthesizes that one too.
    assert_eq!(known.vanished(&subjects, None, &listed).len(), 1);
}

/// One step of the previous-sequence table.
enum Step {
    /// The ingest sees an event; its published event says this of the pod's previous one.
    See(Box<PodEvent>, Sighting, Option<u64>),
    /// JetStream acks the event of pod `uid` at revision `rv` (or its notice) at a sequence.
    Ack(&'static str, u64, Role, u64),
}

#[test]
fn each_event_says_where_the_pods_previous_event_went_when_the_ingest_knows() {
    use EventType::{Deleted, Modified};
    use Sighting::{Listing, Watch};
    use Step::{Ack, See};
    let subjects = Subjects::new("podstream").unwrap();
    let mut known = KnownPods::new();
    let mut published: Vec<podstream_ingest::known::Outgoing> = Vec::new();
    let table = vec![
        // A pod a live watch shows for the first time had no earlier event.
        See(
            Box::new(event("a", "airflow", "1", 10, Modified)),
            Watch,
            Some(0),
        ),
        Ack("a", 10, Role::Event, 101),
        // Its next event points at the acked one.
        See(
            Box::new(event("a", "airflow", "1", 12, Modified)),
            Watch,
            Some(101),
        ),
        // Published before that ack came back: unknown.
        See(
            Box::new(event("a", "airflow", "1", 13, Modified)),
            Watch,
            None,
        ),
        // A late ack of an overtaken event changes nothing; the last one's ack counts.
        Ack("a", 12, Role::Event, 102),
        See(
            Box::new(event("a", "airflow", "1", 14, Modified)),
            Listing,
            None,
        ),
        Ack("a", 14, Role::Event, 104),
        // A relabel: the event points at the last event; the notice's ack is no event.
        See(
            Box::new(event("a", "airflow", "2", 15, Modified)),
            Watch,
            Some(104),
        ),
        Ack("a", 15, Role::Event, 105),
        Ack("a", 15, Role::Left, 106),
        See(
            Box::new(event("a", "airflow", "2", 20, Deleted)),
            Watch,
            Some(105),
        ),
        // Back after its delete (the label removed and set again): not a first sighting.
        See(
            Box::new(event("a", "airflow", "2", 25, Modified)),
            Watch,
            None,
        ),
        // A list or a replay cannot vouch for a pod it did not know: an earlier process may
        // have published it.
        See(
            Box::new(event("b", "airflow", "1", 30, Modified)),
            Listing,
            None,
        ),
    ];
    for (n, step) in table.into_iter().enumerate() {
        match step {
            See(seen, sighting, expected) => {
                let out = known.observe(&subjects, (*seen).clone(), sighting);
                let event = out.iter().find(|o| o.role == Role::Event).unwrap();
                assert_eq!(
                    event.event.previous_sequence, expected,
                    "row {n}: {seen:?} ({sighting:?})"
                );
                published.extend(out);
            }
            Ack(uid, rv, role, sequence) => {
                let out = published
                    .iter()
                    .find(|o| {
                        o.event.pod.as_ref().unwrap().uid == uid
                            && o.event.resource_version == rv.to_string()
                            && o.role == role
                    })
                    .unwrap_or_else(|| panic!("row {n}: nothing published as {uid}:{rv}"));
                known.acked(out, sequence);
            }
        }
    }
}

#[test]
fn a_synthesized_delete_points_at_the_pods_last_event_once_acked() {
    let subjects = Subjects::new("podstream").unwrap();
    // From the checkpoint: where its events went is not known.
    let mut known =
        KnownPods::from_events([event("restored", "airflow", "1", 5, EventType::Modified)]);
    let seen = known.observe(
        &subjects,
        event("seen", "airflow", "1", 9, EventType::Modified),
        Sighting::Watch,
    );
    known.acked(&seen[0], 42);
    let mut out = known.vanished(&subjects, None, &HashSet::new());
    out.sort_by(|a, b| a.subject.cmp(&b.subject));
    let stamps: Vec<(&str, Option<u64>)> = out
        .iter()
        .map(|o| (o.subject.as_str(), o.event.previous_sequence))
        .collect();
    assert_eq!(
        stamps,
        vec![
            ("podstream.pods.1.restored", None),
            ("podstream.pods.1.seen", Some(42)),
        ]
    );
}

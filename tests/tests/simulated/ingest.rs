//! `podstream ingest` against a real nats-server and the simulator: every (uid, resourceVersion)
//! once, on the right subject, across kills, 410s and NATS restarts.

use podstream_bus::BusConfig;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use async_nats::jetstream;
use podstream_ingest::service::{self, IngestConfig};
use podstream_proto::subject::Subjects;
use podstream_proto::subject::stream_names;
use podstream_proto::v1::EventType;
use podstream_sim::{Cluster, Deletion, Server, SimConfig, WorkerPod};
use podstream_tests::bus::{self, Stored};
use podstream_tests::ingest::InProcessIngest as Ingest;
use podstream_tests::kube_client;
use podstream_tests::nats::NatsServer;
use serde_json::Value;

const PODS: &str = stream_names::PODS;

async fn start_ingest(sim: &Server, nats: &str) -> Ingest {
    let config = IngestConfig {
        bus: BusConfig::at(nats),
        checkpoint_interval: Duration::from_millis(50),
        ..IngestConfig::default()
    };
    Ingest::start(config, kube_client(sim).await)
}

async fn sim() -> Server {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = SimConfig {
        namespaces: vec!["airflow".into()],
        bookmark_interval: Duration::from_millis(500),
        ..SimConfig::default()
    };
    Server::start(addr, config).await.unwrap()
}

async fn jetstream(url: &str) -> jetstream::Context {
    jetstream::new(async_nats::connect(url).await.unwrap())
}

/// One fact of the scenario: a pod at a revision, with its owner then.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Fact {
    uid: String,
    rv: u64,
    owner: String,
    deleted: bool,
}

fn fact(pod: &Value, deleted: bool) -> Fact {
    Fact {
        uid: pod["metadata"]["uid"].as_str().unwrap().to_owned(),
        rv: pod["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap(),
        owner: pod["metadata"]["labels"]["airflow-worker"]
            .as_str()
            .unwrap()
            .to_owned(),
        deleted,
    }
}

/// Drives pods through the control API and records every change as a fact.
struct Scenario {
    cluster: Cluster,
    facts: Vec<Fact>,
    relabels: Vec<(Fact, String)>,
}

impl Scenario {
    fn new(cluster: &Cluster) -> Scenario {
        Scenario {
            cluster: cluster.clone(),
            facts: Vec::new(),
            relabels: Vec::new(),
        }
    }

    fn create(&mut self, name: &str, owner: &str) {
        let pod = WorkerPod::new(
            name,
            owner,
            "etl",
            name,
            "scheduled__2026-11-30T10:00:00+00:00",
        );
        let created = self.cluster.create_pod(pod.to_json()).unwrap();
        self.facts.push(fact(&created, false));
    }

    fn phase(&mut self, name: &str, phase: &str) {
        let pod = self.cluster.set_phase("airflow", name, phase).unwrap();
        self.facts.push(fact(&pod, false));
    }

    fn relabel(&mut self, name: &str, owner: &str) {
        let before = self.cluster.pod("airflow", name).unwrap();
        let old_owner = before["metadata"]["labels"]["airflow-worker"]
            .as_str()
            .unwrap()
            .to_owned();
        let pod = self
            .cluster
            .relabel("airflow", name, "airflow-worker", Some(owner))
            .unwrap();
        let fact = fact(&pod, false);
        self.relabels.push((fact.clone(), old_owner));
        self.facts.push(fact);
    }

    fn delete(&mut self, name: &str) {
        let Deletion::Gone(last) = self.cluster.delete_pod("airflow", name, Some(0)).unwrap()
        else {
            panic!("grace 0 deletes at once")
        };
        self.facts.push(fact(&last.value().unwrap(), true));
    }

    /// Waits until the pod stream holds a message for every fact and relabel notice (quiet
    /// for `quiet`, at most `within`); returns how many that is.
    async fn settle(&self, js: &jetstream::Context, quiet: Duration, within: Duration) -> u64 {
        let expected = (self.facts.len() + self.relabels.len()) as u64;
        bus::settle(js, PODS, expected, quiet, within).await;
        expected
    }

    /// Step `step` of pod `i`'s life: create, run, maybe relabel, end, maybe delete.
    fn step(&mut self, i: usize, step: usize) {
        let name = format!("pod-{i:04}");
        match step {
            0 => self.create(&name, &(1 + i % 3).to_string()),
            1 => self.phase(&name, "Running"),
            2 if i.is_multiple_of(10) => self.relabel(&name, &(1 + (i + 1) % 3).to_string()),
            3 => self.phase(
                &name,
                if i.is_multiple_of(2) {
                    "Succeeded"
                } else {
                    "Failed"
                },
            ),
            4 if i.is_multiple_of(5) => self.delete(&name),
            _ => {}
        }
    }
}

const STEPS: usize = 5;

/// A stored event: the fact, its subject, whether it was synthesized.
type StoredEvent = (Fact, String, bool);
/// A stored owner notice: uid, resourceVersion, the owner whose subject carries it.
type Notice = (String, u64, String);

/// The role=event messages as facts, and the role=left messages as notices.
/// Checks what each event says of its pod's previous event, where it says anything: 0 when
/// the stream holds no earlier event of the pod, else the sequence of the pod's last earlier
/// event (notices are not events). Returns how many events said something.
fn assert_previous_sequences(stored: &[Stored]) -> usize {
    let mut last_event: HashMap<String, u64> = HashMap::new();
    let mut vouched = 0;
    for message in stored {
        if message.header("Podstream-Role") != Some("event") {
            continue;
        }
        let event = message.pod_event();
        let uid = event.pod.as_ref().unwrap().uid.clone();
        if let Some(previous) = event.previous_sequence {
            vouched += 1;
            assert_eq!(
                previous,
                last_event.get(&uid).copied().unwrap_or(0),
                "event at {} of pod {uid}",
                message.sequence
            );
        }
        last_event.insert(uid, message.sequence);
    }
    vouched
}

/// Every pod event and notice in the stream; also checks (in every scenario: crashes, 410s,
/// NATS restarts) that what an event says of its pod's previous event is true.
fn read_facts(stored: &[Stored]) -> (Vec<StoredEvent>, Vec<Notice>) {
    assert_previous_sequences(stored);
    let subjects = Subjects::new("podstream").unwrap();
    let mut events = Vec::new();
    let mut notices = Vec::new();
    for message in stored {
        let event = message.pod_event();
        let (subject_owner, subject_uid) = subjects.parse(&message.subject).unwrap();
        let uid = event.pod.as_ref().unwrap().uid.clone();
        assert_eq!(subject_uid, uid, "subject names the pod");
        let rv: u64 = event.resource_version.parse().unwrap();
        match message.header("Podstream-Role") {
            Some("event") => {
                assert_eq!(
                    subject_owner, event.owner,
                    "an event goes on its owner's subject"
                );
                let fact = Fact {
                    uid,
                    rv,
                    owner: event.owner.clone(),
                    deleted: event.r#type() == EventType::Deleted,
                };
                events.push((fact, message.subject.clone(), event.synthesized));
            }
            Some("left") => notices.push((uid, rv, subject_owner)),
            other => panic!("unexpected role {other:?}"),
        }
    }
    (events, notices)
}

/// Per pod, events are stored in increasing resourceVersion order.
fn assert_ordered_per_pod(events: &[StoredEvent]) {
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (fact, _, _) in events {
        if let Some(previous) = last.insert(&fact.uid, fact.rv) {
            assert!(
                fact.rv > previous,
                "pod {} went from rv {previous} back to {}",
                fact.uid,
                fact.rv
            );
        }
    }
}

/// A nats-server, the simulator, a JetStream client and a running ingest that has listed.
async fn rig() -> (NatsServer, Server, jetstream::Context, Ingest, Scenario) {
    let nats = NatsServer::start();
    let sim = sim().await;
    let js = jetstream(&nats.url()).await;
    let ingest = start_ingest(&sim, &nats.url()).await;
    let mut scenario = Scenario::new(sim.cluster());
    wait_until_watching(&js, &mut scenario).await;
    (nats, sim, js, ingest, scenario)
}

/// The stream's events are exactly the scenario's facts: none missing, none twice.
fn assert_exactly(events: &[StoredEvent], facts: &[Fact]) {
    let mut got: Vec<Fact> = events.iter().map(|(f, _, _)| f.clone()).collect();
    let mut want = facts.to_vec();
    got.sort();
    want.sort();
    let missing: Vec<_> = want
        .iter()
        .filter(|f| got.binary_search(f).is_err())
        .take(5)
        .collect();
    assert!(missing.is_empty(), "missing facts, e.g. {missing:?}");
    assert_eq!(got.len(), want.len(), "no fact twice");
    assert_ordered_per_pod(events);
}

/// Waits for the ingest to have listed: a sentinel pod must reach the stream.
async fn wait_until_watching(js: &jetstream::Context, scenario: &mut Scenario) {
    scenario.create("sentinel", "0");
    bus::settle(
        js,
        PODS,
        1,
        Duration::from_millis(1),
        Duration::from_secs(30),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_pods_every_revision_once_on_its_owners_subject() {
    let (_nats, _sim, js, ingest, mut scenario) = rig().await;

    for step in 0..STEPS {
        for i in 0..1000 {
            scenario.step(i, step);
        }
    }
    let expected = scenario
        .settle(&js, Duration::from_millis(500), Duration::from_secs(60))
        .await;
    let stats = ingest.stop().await;

    let stored = bus::read_all(&js, PODS).await;
    let (events, notices) = read_facts(&stored);
    assert_exactly(&events, &scenario.facts);
    assert!(events.iter().all(|(_, _, synthesized)| !synthesized));
    // Watched live, most events can say where their pod's previous one is (not those
    // published before that one's ack came back).
    let vouched = assert_previous_sequences(&stored);
    assert!(
        vouched * 2 > events.len(),
        "only {vouched} of {} events vouched for",
        events.len()
    );

    // Each relabel: the new owner's subject has the event, the old owner's the notice.
    let notices: HashSet<Notice> = notices.into_iter().collect();
    assert_eq!(notices.len(), scenario.relabels.len());
    for (fact, old_owner) in &scenario.relabels {
        assert!(
            notices.contains(&(fact.uid.clone(), fact.rv, old_owner.clone())),
            "no notice to {old_owner} for {fact:?}"
        );
    }
    assert_eq!(stats.published, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_twenty_points_the_stream_still_holds_the_whole_scenario_once() {
    let (nats, sim, js, mut ingest, mut scenario) = rig().await;

    // 300 pods, their steps interleaved; the ingest is killed at 20 pseudo-random steps and
    // restarted a few steps later, so changes happen both in flight and while it is down.
    let pods = 300;
    let mut order: Vec<(usize, usize)> = (0..STEPS)
        .flat_map(|s| (0..pods).map(move |i| (i, s)))
        .collect();
    let mut seed: u64 = 0x5eed;
    let mut random = move |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize % n
    };
    // Interleave pods but keep each pod's own steps in order: sort by a random key per step
    // that grows with the step.
    order.sort_by_key(|&(i, s)| (s * pods + (i * 7919) % pods, i));
    let mut kills: Vec<usize> = (0..20).map(|_| random(order.len())).collect();
    kills.sort_unstable();
    kills.dedup();
    let mut down_until = None;
    for (n, &(i, s)) in order.iter().enumerate() {
        if kills.binary_search(&n).is_ok() && down_until.is_none() {
            ingest.kill().await;
            ingest = Ingest::down();
            down_until = Some(n + 1 + random(15));
        }
        scenario.step(i, s);
        if down_until == Some(n) {
            ingest = start_ingest(&sim, &nats.url()).await;
            down_until = None;
        }
        if n.is_multiple_of(50) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    if down_until.is_some() {
        ingest = start_ingest(&sim, &nats.url()).await;
    }
    scenario
        .settle(&js, Duration::from_millis(1500), Duration::from_secs(90))
        .await;
    ingest.stop().await;

    let (events, _) = read_facts(&bus::read_all(&js, PODS).await);
    assert_exactly(&events, &scenario.facts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_while_history_is_gone_arrive_as_synthesized_deletes() {
    let (nats, sim, js, ingest, mut scenario) = rig().await;
    for i in 0..20 {
        scenario.step(i, 0);
        scenario.step(i, 1);
    }
    bus::settle(
        &js,
        PODS,
        41,
        Duration::from_millis(300),
        Duration::from_secs(30),
    )
    .await;
    ingest.stop().await;

    // While it is down: some pods finish, some vanish, one appears; then history is compacted.
    for i in 0..5 {
        scenario.phase(&format!("pod-{i:04}"), "Failed");
    }
    for i in 5..10 {
        scenario.delete(&format!("pod-{i:04}"));
    }
    scenario.create("pod-late", "2");
    sim.cluster().compact();

    let ingest = start_ingest(&sim, &nats.url()).await;
    bus::settle(
        &js,
        PODS,
        41 + 11,
        Duration::from_millis(500),
        Duration::from_secs(30),
    )
    .await;
    ingest.stop().await;
    let (events, _) = read_facts(&bus::read_all(&js, PODS).await);
    let tail = &events[41..];
    assert_eq!(
        tail.len(),
        11,
        "5 finished, 5 synthesized deletes, 1 new pod: {tail:#?}"
    );
    let synthesized: BTreeMap<String, u64> = tail
        .iter()
        .filter(|(_, _, s)| *s)
        .map(|(f, _, _)| (f.uid.clone(), f.rv))
        .collect();
    assert_eq!(synthesized.len(), 5);
    for (fact, _, is_synthesized) in tail {
        if *is_synthesized {
            assert!(fact.deleted, "a synthesized event is a delete");
        }
    }
    // The finished pods arrive at their latest revision (history was gone: collapsed, not lost).
    for i in 0..5 {
        let uid = uid_of(&scenario, i);
        let latest = scenario.facts.iter().rev().find(|f| f.uid == uid).unwrap();
        assert!(
            tail.iter().any(|(f, _, _)| f == latest),
            "latest state of pod-{i:04} published"
        );
    }
    assert_ordered_per_pod(&events);
}

fn uid_of(scenario: &Scenario, i: usize) -> String {
    scenario
        .cluster
        .pod("airflow", &format!("pod-{i:04}"))
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_410_mid_stream_relists_without_loss_or_duplicates() {
    let (_nats, sim, js, ingest, mut scenario) = rig().await;
    for i in 0..30 {
        scenario.step(i, 0);
    }
    bus::settle(
        &js,
        PODS,
        31,
        Duration::from_millis(300),
        Duration::from_secs(30),
    )
    .await;

    // The apiserver restarts and compacts while the watch reconnects (slowed, so the order
    // is certain): the watcher gets 410 and lists again.
    sim.cluster().set_latency(Duration::from_millis(300));
    sim.cluster().drop_watches();
    for i in 0..10 {
        scenario.phase(&format!("pod-{i:04}"), "Running");
    }
    for i in 10..15 {
        scenario.delete(&format!("pod-{i:04}"));
    }
    scenario.create("pod-new", "3");
    sim.cluster().compact();
    sim.cluster().set_latency(Duration::ZERO);
    // And the watch goes on after the re-list.
    bus::settle(
        &js,
        PODS,
        31 + 16,
        Duration::from_millis(1500),
        Duration::from_secs(30),
    )
    .await;
    scenario.phase("pod-0020", "Running");
    bus::settle(
        &js,
        PODS,
        31 + 17,
        Duration::from_millis(500),
        Duration::from_secs(30),
    )
    .await;
    ingest.stop().await;

    let (events, _) = read_facts(&bus::read_all(&js, PODS).await);
    assert_eq!(events.len(), 31 + 17, "nothing lost, nothing twice");
    let keys: HashSet<(String, u64)> = events
        .iter()
        .map(|(f, _, _)| (f.uid.clone(), f.rv))
        .collect();
    assert_eq!(keys.len(), events.len(), "no (uid, resourceVersion) twice");
    let synthesized = events.iter().filter(|(_, _, s)| *s).count();
    assert_eq!(
        synthesized, 5,
        "the five deletes the watch missed are synthesized"
    );
    for fact in scenario.facts.iter().filter(|f| !f.deleted) {
        assert!(
            keys.contains(&(fact.uid.clone(), fact.rv)),
            "{fact:?} missing"
        );
    }
    assert_ordered_per_pod(&events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_mid_stream_loses_nothing() {
    let mut nats = NatsServer::start();
    let sim = sim().await;
    let url = nats.url();
    let js = jetstream(&url).await;
    let ingest = start_ingest(&sim, &url).await;
    let mut scenario = Scenario::new(sim.cluster());
    wait_until_watching(&js, &mut scenario).await;
    for i in 0..200 {
        scenario.step(i, 0);
    }
    // Restart NATS on the same storage while pods keep changing.
    let cluster = sim.cluster().clone();
    let driver = std::thread::spawn(move || {
        let mut scenario = Scenario::new(&cluster);
        for i in 0..200 {
            scenario.step(i, 1);
            std::thread::sleep(Duration::from_millis(5));
        }
        scenario.facts
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    nats.restart();
    let more = driver.join().unwrap();
    scenario.facts.extend(more);
    let js = jetstream(&url).await;
    let expected = scenario.facts.len() as u64;
    bus::settle(
        &js,
        PODS,
        expected,
        Duration::from_millis(1000),
        Duration::from_secs(60),
    )
    .await;
    ingest.stop().await;

    let (events, _) = read_facts(&bus::read_all(&js, PODS).await);
    assert_exactly(&events, &scenario.facts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_pod_is_dead_lettered_and_the_stream_goes_on() {
    // One broken pod is in the first list, the other arrives on the live watch: a try that
    // is no integer, and a TI UUID that is no UUID (never a fallback to the names).
    fn broken(name: &str, annotation: &str, value: &str) -> Value {
        let mut pod = WorkerPod::new(name, "1", "etl", "t", "r").to_json();
        pod["metadata"]["annotations"][annotation] = value.into();
        pod
    }
    let nats = NatsServer::start();
    let sim = sim().await;
    let js = jetstream(&nats.url()).await;
    let listed = sim
        .cluster()
        .create_pod(broken("broken-listed", "try_number", "one"))
        .unwrap();
    let ingest = start_ingest(&sim, &nats.url()).await;
    let mut scenario = Scenario::new(sim.cluster());
    wait_until_watching(&js, &mut scenario).await;
    let watched = sim
        .cluster()
        .create_pod(broken("broken-watched", "task_instance_id", "ti-42"))
        .unwrap();
    // A pod that stays unusable is one dead letter per reason, not one per revision.
    for phase in ["Pending", "Running", "Running", "Failed"] {
        sim.cluster()
            .set_phase("airflow", "broken-watched", phase)
            .unwrap();
    }
    scenario.create("after-broken", "1");
    bus::settle(
        &js,
        PODS,
        2,
        Duration::from_millis(300),
        Duration::from_secs(30),
    )
    .await;
    bus::settle(
        &js,
        stream_names::DEAD,
        2,
        Duration::from_millis(100),
        Duration::from_secs(30),
    )
    .await;
    ingest.stop().await;

    let dead = bus::read_all(&js, stream_names::DEAD).await;
    assert_eq!(dead.len(), 2);
    for ((letter, pod), annotation) in dead
        .iter()
        .zip([&listed, &watched])
        .zip(["try_number", "task_instance_id"])
    {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let uid = pod["metadata"]["uid"].as_str().unwrap();
        assert_eq!(letter.subject, "podstream.dead.ingest");
        let reason = letter.header("Podstream-Reason").unwrap();
        assert!(reason.contains(annotation), "{name}: {reason}");
        // Named by pod and reason, so a retried dead letter is stored once (and a pod that
        // stays unusable once) and a reader finds the pod.
        assert_eq!(
            letter.header("Nats-Msg-Id").unwrap(),
            podstream_proto::msg_id::dead_pod(uid, reason),
            "{name}"
        );
        let source = letter.header("Podstream-Source").unwrap();
        assert!(source.contains(name) && source.contains(uid), "{source}");
        let kept: Value = serde_json::from_slice(&letter.payload).unwrap();
        assert_eq!(kept["metadata"]["name"], name, "the pod's metadata is kept");
        assert_eq!(kept["kind"], "Pod");
        assert!(
            kept["status"]["phase"].is_string(),
            "and its status: {kept}"
        );
        assert!(
            kept.get("spec").is_none(),
            "never its spec (env values, volumes): {kept}"
        );
    }
    let (events, _) = read_facts(&bus::read_all(&js, PODS).await);
    assert_eq!(
        events.len(),
        2,
        "the sentinel and the pod after the broken ones"
    );
}

/// A malformed pod bigger than the server's max_payload (1 MB by default) is dead-lettered
/// cut to fit, with its original size and where to find it; the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_over_the_max_payload_is_cut_to_fit_and_the_stream_goes_on() {
    let nats = NatsServer::start();
    let sim = sim().await;
    let js = jetstream(&nats.url()).await;
    let ingest = start_ingest(&sim, &nats.url()).await;
    let mut scenario = Scenario::new(sim.cluster());
    wait_until_watching(&js, &mut scenario).await;
    let mut huge = WorkerPod::new("huge-broken", "1", "etl", "t", "r").to_json();
    huge["metadata"]["annotations"]["try_number"] = "one".into();
    huge["metadata"]["annotations"]["blob"] = "x".repeat(1_500_000).into();
    let huge = sim.cluster().create_pod(huge).unwrap();
    scenario.create("after-huge", "1");
    bus::settle(
        &js,
        PODS,
        2,
        Duration::from_millis(300),
        Duration::from_secs(30),
    )
    .await;
    bus::settle(
        &js,
        stream_names::DEAD,
        1,
        Duration::from_millis(100),
        Duration::from_secs(30),
    )
    .await;
    ingest.stop().await;

    let dead = bus::read_all(&js, stream_names::DEAD).await;
    assert_eq!(dead.len(), 1);
    let letter = &dead[0];
    let original: usize = letter
        .header("Podstream-Original-Size")
        .unwrap()
        .parse()
        .unwrap();
    assert!(original > 1_500_000, "{original}");
    assert!(
        letter.payload.len() < 1024 * 1024,
        "{}",
        letter.payload.len()
    );
    assert!(
        letter.payload.starts_with(b"{"),
        "the start of the raw object"
    );
    let source = letter.header("Podstream-Source").unwrap();
    let uid = huge["metadata"]["uid"].as_str().unwrap();
    assert!(
        source.contains("huge-broken") && source.contains(uid),
        "{source}"
    );
    let (events, _) = read_facts(&bus::read_all(&js, PODS).await);
    assert_eq!(
        events.len(),
        2,
        "the sentinel and the pod after the huge one"
    );
}

/// A checkpoint written less often than half the duplicate window could let a crash
/// republish events the window no longer collapses: refused before anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_interval_near_the_duplicate_window_is_refused() {
    let sim = sim().await;
    let config = IngestConfig {
        bus: BusConfig::at("nats://127.0.0.1:1"),
        checkpoint_interval: Duration::from_secs(61),
        ..IngestConfig::default()
    };
    let error = service::run(config, kube_client(&sim).await, std::future::pending())
        .await
        .unwrap_err();
    assert!(
        format!("{error:#}").contains("under half the duplicate window"),
        "{error:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_stream_is_refused_with_a_clear_error() {
    let nats = NatsServer::start();
    let sim = sim().await;
    let js = jetstream(&nats.url()).await;
    js.create_stream(jetstream::stream::Config {
        name: PODS.into(),
        subjects: vec!["somebody.else.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let ingest = start_ingest(&sim, &nats.url()).await;
    let error = ingest.ended().await.unwrap_err();
    let message = podstream_bus::retry::with_causes(&error);
    assert!(
        message.contains(stream_names::PODS) && message.contains("subjects"),
        "{message}"
    );
}

/// The Lease's holder, if any.
fn lease_holder(cluster: &Cluster) -> Option<String> {
    let key = podstream_sim::object::Key::new(
        podstream_sim::resource::Resource::Leases,
        "default",
        podstream_ingest::leadership::DEFAULT_LEASE_NAME,
    );
    let lease = cluster.get(&key).ok()?.value().ok()?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
}

/// Three ingest processes elect one through the simulator's Lease. The leader is killed twice
/// during churn, then one is stopped (SIGSTOP) past its lease and woken: every change is in
/// the stream once, in per-pod order, each takeover comes within 15 s, and the woken leader
/// exits without writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ingests_one_leader_killed_and_paused_every_change_once() {
    use podstream_tests::component::Component;
    use std::time::Instant;

    let (sim, dir) = podstream_tests::recovery::simulator().await;
    let kubeconfig = dir.path().join("kubeconfig");
    let nats = NatsServer::start();
    let url = nats.url();
    let js = jetstream(&url).await;
    let names = ["ingest-a", "ingest-b", "ingest-c"];
    let mut ingests: Vec<Component> = names
        .iter()
        .map(|name| {
            Component::start_with_env(
                podstream_tests::podstream_binary(),
                &["ingest", "--nats", &url, "--checkpoint-interval-ms", "200"],
                &kubeconfig,
                &[("POD_NAME", name)],
            )
        })
        .collect();
    let cluster = sim.cluster().clone();
    let mut scenario = Scenario::new(&cluster);
    wait_until_watching(&js, &mut scenario).await;
    let leader = |cluster: &Cluster| -> Option<usize> {
        let holder = lease_holder(cluster)?;
        names
            .iter()
            .position(|name| holder.starts_with(&format!("{name}_")))
    };

    let pods = 400;
    let mut order: Vec<(usize, usize)> = (0..STEPS)
        .flat_map(|s| (0..pods).map(move |i| (i, s)))
        .collect();
    order.sort_by_key(|&(i, s)| (s * pods + (i * 7919) % pods, i));
    let mut steps = order.into_iter();

    // Kill, kill, pause: each waits for the previous takeover and a few seconds of churn.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Fault {
        Kill,
        Pause,
    }
    let mut faults = vec![Fault::Kill, Fault::Kill, Fault::Pause].into_iter();
    let mut next_fault_at = Instant::now() + Duration::from_secs(3);
    let mut pending: Option<(Fault, usize, Instant)> = None;
    let mut takeovers = Vec::new();
    let mut paused_exit = None;
    loop {
        if let Some((i, s)) = steps.next() {
            scenario.step(i, s);
        }
        let now = Instant::now();
        match pending {
            None if now >= next_fault_at => match faults.next() {
                Some(fault) => {
                    let current = leader(&cluster).expect("a leader holds the lease");
                    match fault {
                        Fault::Kill => ingests[current].kill(),
                        Fault::Pause => ingests[current].signal("STOP"),
                    }
                    pending = Some((fault, current, now));
                }
                None if paused_exit.is_some() => break,
                None => {}
            },
            Some((fault, old, at)) => {
                if let Some(new) = leader(&cluster).filter(|&new| new != old) {
                    let took = at.elapsed();
                    takeovers.push(took);
                    eprintln!(
                        "{fault:?} of {}: {} took over in {took:?}",
                        names[old], names[new]
                    );
                    match fault {
                        Fault::Kill => ingests[old].restart(),
                        Fault::Pause => {
                            ingests[old].signal("CONT");
                            paused_exit = Some(ingests[old].wait_exit(Duration::from_secs(15)));
                            ingests[old].restart();
                        }
                    }
                    pending = None;
                    next_fault_at = Instant::now() + Duration::from_secs(3);
                } else {
                    assert!(
                        at.elapsed() < Duration::from_secs(30),
                        "no takeover 30 s after the {fault:?} of {}",
                        names[old]
                    );
                }
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, s) in steps {
        scenario.step(i, s);
    }

    scenario
        .settle(&js, Duration::from_millis(1500), Duration::from_secs(90))
        .await;
    let (events, _) = read_facts(&bus::read_all(&js, PODS).await);
    assert_exactly(&events, &scenario.facts);

    assert_eq!(takeovers.len(), 3);
    for took in &takeovers {
        assert!(*took <= Duration::from_secs(15), "takeovers: {takeovers:?}");
    }
    let woken = paused_exit.flatten().expect("the woken old leader exits");
    assert!(
        !woken.success(),
        "a deposed leader exits with an error: {woken:?}"
    );
    for ingest in ingests {
        ingest.terminate();
    }
}

/// The checkpoint's fencing: a writer whose claim another ingest took is deposed at its next
/// write; a key moved by a write of its own whose ack was lost is only rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_claimed_by_another_ingest_deposes_the_first_writer() {
    use podstream_ingest::checkpoint::{Checkpoint, CheckpointError};
    use podstream_ingest::leadership::Fence;

    let nats = NatsServer::start();
    let js = jetstream(&nats.url()).await;
    let open = || Checkpoint::open(&js, "fencing", 1, Duration::from_millis(10), Fence::open());
    let mut first = open().await.unwrap();
    assert_eq!(first.claim("first").await.unwrap(), 1);
    first.load().await.unwrap();
    first.flush().await.unwrap();

    // A write of the first's own lands but its ack is lost: the key moved, the claim is
    // still the first's, so it is rewritten, not deposed.
    let kv = js.get_key_value("fencing").await.unwrap();
    let mine = kv.get("leader").await.unwrap().unwrap();
    assert_eq!(&mine[..], b"1 first");
    kv.put("leader", mine).await.unwrap();
    let error = first.flush().await.unwrap_err();
    assert!(
        matches!(error, CheckpointError::MovedByUs),
        "a lost ack of its own: {error:?}"
    );
    first.flush().await.unwrap();

    let mut second = open().await.unwrap();
    assert_eq!(second.claim("second").await.unwrap(), 2);
    let error = first.flush().await.unwrap_err();
    let CheckpointError::Deposed(deposed) = error else {
        panic!("deposed: {error:?}");
    };
    assert!(deposed.to_string().contains("2 second"), "{deposed}");
    second.flush().await.unwrap();
}

/// Stopped just as the node leading its checkpoint bucket dies, an ingest retries the last
/// checkpoint write through the election instead of failing its stop, and the write lands:
/// a successor loads the last change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_while_its_checkpoint_bucket_elects_a_leader_the_ingest_still_writes_it() {
    use podstream_ingest::checkpoint::Checkpoint;
    use podstream_ingest::leadership::Fence;
    use podstream_tests::nats::NatsCluster;

    podstream_tests::init_tracing();
    let mut nats = NatsCluster::start(3);
    nats.ready().await;
    let urls = nats.urls();
    let servers: Vec<&str> = urls.split(',').collect();
    let js = jetstream::new(async_nats::connect(servers.as_slice()).await.unwrap());
    let sim = sim().await;
    let config = IngestConfig {
        bus: BusConfig {
            streams: podstream_bus::StreamSettings {
                replicas: Some(3),
                ..Default::default()
            },
            ..BusConfig::at(&urls)
        },
        checkpoint_interval: Duration::from_millis(50),
        ..IngestConfig::default()
    };
    let bucket = config.checkpoint_bucket.clone();
    let ingest = Ingest::start(config, kube_client(&sim).await);
    let mut scenario = Scenario::new(sim.cluster());
    wait_until_watching(&js, &mut scenario).await;
    scenario.create("pod-0000", "1");
    scenario
        .settle(&js, Duration::from_millis(200), Duration::from_secs(30))
        .await;
    // Past a checkpoint write, so the bucket has a leader to lose.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut info = js
        .get_stream(podstream_bus::streams::bucket_stream(&bucket))
        .await
        .unwrap();
    let leader = info
        .info()
        .await
        .unwrap()
        .cluster
        .as_ref()
        .and_then(|cluster| cluster.leader.clone())
        .expect("the bucket has a leader");
    let node: usize = leader.trim_start_matches("node-").parse().unwrap();
    scenario.phase("pod-0000", "Running");
    scenario
        .settle(&js, Duration::from_millis(1), Duration::from_secs(30))
        .await;
    nats.kill(node);
    // Stopping panics with the service's error if it failed.
    ingest.stop().await;

    let mut successor = Checkpoint::open(&js, &bucket, 3, Duration::from_millis(50), Fence::open())
        .await
        .unwrap();
    // The bucket may still be electing after the node kill: its reads time out until then.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let restored = loop {
        match successor.load().await {
            Ok(restored) => break restored,
            Err(error) if std::time::Instant::now() < deadline => {
                eprintln!("reading the checkpoint back failed, retrying: {error:#}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => panic!("reading the checkpoint back: {error:#}"),
        }
    };
    let last = scenario.facts.last().unwrap();
    let event = restored
        .pods
        .iter()
        .find(|event| event.pod.as_ref().is_some_and(|pod| pod.uid == last.uid))
        .expect("the checkpoint holds the pod");
    assert_eq!(event.resource_version, last.rv.to_string());
}

/// An ingest in a pod (`POD_NAME` set) killed -9 and started again takes back the Lease its
/// earlier incarnation held at once, though the Lease lasts 60 s: a pod's name is unique among
/// live pods, so that holder has ended. A Lease held by another pod is waited out as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_ingest_takes_its_own_pods_lease_back_at_once() {
    use podstream_tests::component::Component;
    use std::time::Instant;

    let (sim, dir) = podstream_tests::recovery::simulator().await;
    let kubeconfig = dir.path().join("kubeconfig");
    let nats = NatsServer::start();
    let url = nats.url();
    let cluster = sim.cluster().clone();
    let args = ["ingest", "--nats", &url, "--lease-duration-seconds", "60"];
    let holder = |cluster: &Cluster| lease_holder(cluster).unwrap_or_default();
    let wait_for_holder = |prefix: &str, within: Duration| {
        let deadline = Instant::now() + within;
        loop {
            let now = holder(&cluster);
            if now.starts_with(prefix) {
                return now;
            }
            assert!(Instant::now() < deadline, "the Lease is held by {now:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut ingest = Component::start_with_env(
        podstream_tests::podstream_binary(),
        &args,
        &kubeconfig,
        &[("POD_NAME", "ingest-0")],
    );
    let first = wait_for_holder("ingest-0_", Duration::from_secs(30));
    ingest.kill();
    let killed = Instant::now();
    ingest.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        let now = holder(&cluster);
        if now.starts_with("ingest-0_") && now != first {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted ingest did not take its pod's Lease back (held by {now:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = killed.elapsed();
    eprintln!("{first} -> {second} in {took:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");

    // Another pod's ingest does not take a live holder's Lease: it stands by.
    let mut other = Component::start_with_env(
        podstream_tests::podstream_binary(),
        &args,
        &kubeconfig,
        &[("POD_NAME", "ingest-1")],
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(holder(&cluster), second);
    other.kill();
    assert!(ingest.terminate().success());
}

/// A checkpoint shard whose pods do not fit in one message continues in parts, and reads back
/// whole; once its pods fit again, the parts it no longer needs are emptied, so a later load
/// restores no pod that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_over_the_message_limit_is_written_in_parts_and_read_back_whole() {
    use podstream_ingest::checkpoint::Checkpoint;
    use podstream_ingest::known::{Outgoing, Role};
    use podstream_ingest::leadership::Fence;
    use podstream_proto::{PodEvent, PodRef};
    use prost::Message as _;

    let nats = NatsServer::start();
    let js = jetstream(&nats.url()).await;
    // 400 bytes a part: every shard with more than a few pods needs parts.
    let open = || async {
        Checkpoint::open(&js, "parts", 1, Duration::from_millis(10), Fence::open())
            .await
            .unwrap()
            .with_part_limit(400)
    };
    let event = |i: usize, kind: EventType| {
        let mut event = PodEvent {
            pod: Some(PodRef {
                namespace: "airflow".into(),
                name: format!("pod-{i:05}-{}", "x".repeat(60)),
                uid: format!("uid-{i:05}"),
            }),
            resource_version: (i + 1).to_string(),
            owner: "1".into(),
            ..PodEvent::default()
        };
        event.set_type(kind);
        Outgoing {
            subject: String::new(),
            msg_id: String::new(),
            role: Role::Event,
            payload: event.encode_to_vec().into(),
            event,
        }
    };
    let uids = |pods: &[PodEvent]| -> std::collections::BTreeSet<String> {
        pods.iter()
            .filter_map(|e| e.pod.as_ref().map(|p| p.uid.clone()))
            .collect()
    };

    let mut writer = open().await;
    writer.claim("writer").await.unwrap();
    writer.load().await.unwrap();
    for i in 0..20_000 {
        writer.record(&event(i, EventType::Added));
    }
    writer.flush().await.unwrap();
    let kv = js.get_key_value("parts").await.unwrap();
    let keys: Vec<String> = futures::StreamExt::collect::<Vec<_>>(kv.keys().await.unwrap())
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        keys.iter().any(|k| k.matches('.').count() == 2),
        "no shard needed a part: {:?}",
        &keys[..5]
    );
    let restored = open().await.load().await.unwrap();
    assert_eq!(restored.pods.len(), 20_000);

    // All but ten pods leave: their shards fit in one part again.
    for i in 10..20_000 {
        writer.record(&event(i, EventType::Deleted));
    }
    writer.flush().await.unwrap();
    let restored = open().await.load().await.unwrap();
    let expected: std::collections::BTreeSet<String> =
        (0..10).map(|i| format!("uid-{i:05}")).collect();
    assert_eq!(uids(&restored.pods), expected);
}

//! `podstream process` on a real nats-server: pod events published as the ingest publishes
//! them (its own core, `KnownPods`), commands read back from the commands stream.

use podstream_bus::BusConfig;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use async_nats::jetstream;
use podstream_processor::service::{self, ProcessConfig, ProcessStats};
use podstream_proto::subject::stream_names;
use podstream_proto::v1::{Phase, command::Kind};
use podstream_proto::{Command, PodEvent};
use podstream_tests::bus::{self, PodFeed as Feed, Stored};
use podstream_tests::nats::NatsServer;
use prost::Message as _;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const PODS: &str = stream_names::PODS;
const COMMANDS: &str = stream_names::COMMANDS;
const DEAD: &str = stream_names::DEAD;

struct Processor {
    task: JoinHandle<Result<ProcessStats, podstream_processor::service::ProcessError>>,
    stop: oneshot::Sender<()>,
}

fn start(nats: &str, schedulers: &[&str], batch_size: usize) -> Processor {
    start_with(ProcessConfig {
        bus: BusConfig::at(nats),
        schedulers: schedulers.iter().map(|s| (*s).to_owned()).collect(),
        batch_size,
        ..ProcessConfig::default()
    })
}

fn start_with(config: ProcessConfig) -> Processor {
    podstream_tests::init_tracing();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(service::run(config, async move {
        let _ = stopped.await;
    }));
    Processor { task, stop }
}

impl Processor {
    async fn stop(self) -> ProcessStats {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap()
    }

    /// As kill -9 would: whatever was in hand is neither finished nor acked.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn event(name: &str, owner: &str, rv: u64, phase: Phase) -> PodEvent {
    bus::pod_event(name, name, owner, rv, phase)
}

fn commands(stored: &[Stored]) -> Vec<(String, Command)> {
    stored
        .iter()
        .map(|m| {
            (
                m.subject.clone(),
                Command::decode(m.payload.as_ref()).unwrap(),
            )
        })
        .collect()
}

fn kind(command: &Command) -> &'static str {
    command.kind.as_ref().map_or("none", |k| k.name())
}

fn uid(command: &Command) -> &str {
    command.pod.as_ref().map_or("", |p| p.uid.as_str())
}

async fn wait_for_commands(js: &jetstream::Context, n: u64) -> Vec<(String, Command)> {
    bus::settle(
        js,
        COMMANDS,
        n,
        Duration::from_millis(500),
        Duration::from_secs(120),
    )
    .await;
    commands(&bus::read_all(js, COMMANDS).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relabel_is_one_transfer_to_the_new_owner_told_to_the_old_and_the_notice_is_not_decided()
{
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    feed.publish(vec![
        event("load", "1", 10, Phase::Running),
        event("load", "2", 11, Phase::Running),
        event("load", "2", 12, Phase::Succeeded),
    ])
    .await;
    assert_eq!(
        bus::count(&feed.js, PODS).await,
        4,
        "three events and one notice"
    );

    let processor = start(&nats.url(), &[], 256);
    let got = wait_for_commands(&feed.js, 4).await;
    let stats = processor.stop().await;
    let stored = bus::read_all(&feed.js, COMMANDS).await;
    let seen: Vec<(&str, &str, Option<&str>)> = got
        .iter()
        .zip(&stored)
        .map(|((s, c), m)| (s.as_str(), kind(c), m.header("Podstream-Role")))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("podstream.commands.1.uid-load", "running", Some("event")),
            // The old owner's copy: its executor frees the slot; the sink skips it.
            ("podstream.commands.1.uid-load", "transfer", Some("left")),
            ("podstream.commands.2.uid-load", "transfer", Some("event")),
            ("podstream.commands.2.uid-load", "completed", Some("event")),
        ]
    );
    assert_eq!(got[1].1, got[2].1, "one command, on both owners' subjects");
    match &got[2].1.kind {
        Some(Kind::Transfer(t)) => assert_eq!((t.from.as_str(), t.to.as_str()), ("1", "2")),
        other => panic!("expected a transfer, got {other:?}"),
    }
    assert_eq!(stats.decided, 3, "the notice is acked, not decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processors_bound_to_two_schedulers_each_see_only_their_pods() {
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    let mut events = Vec::new();
    for i in 0..50 {
        let owner = if i % 2 == 0 { "1" } else { "7" };
        events.push(event(&format!("p{i}"), owner, 100 + i, Phase::Running));
    }
    feed.publish(events).await;

    let one = start(&nats.url(), &["1"], 16);
    let seven = start(&nats.url(), &["7"], 16);
    let got = wait_for_commands(&feed.js, 50).await;
    let (one, seven) = (one.stop().await, seven.stop().await);
    assert_eq!((one.decided, seven.decided), (25, 25));
    for (subject, command) in &got {
        let number: u64 = uid(command).trim_start_matches("uid-p").parse().unwrap();
        let owner = if number.is_multiple_of(2) { "1" } else { "7" };
        assert_eq!(
            subject,
            &format!("podstream.commands.{owner}.{}", uid(command))
        );
    }
    let stream = feed.js.get_stream(PODS).await.unwrap();
    for (name, filter) in [
        ("podstream-process-1", "podstream.pods.1.*"),
        ("podstream-process-7", "podstream.pods.7.*"),
    ] {
        let mut consumer = stream
            .get_consumer::<jetstream::consumer::pull::Config>(name)
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        assert_eq!(info.config.filter_subject, filter);
        assert_eq!(info.num_ack_pending, 0, "{name}: everything acked");
    }
}

/// Three processors share one scheduler's consumer, small batches, 10,000 pods whose three
/// events each sit close together in the stream: every pod still gets `running` then
/// `completed`, each once, in that order. One processor is killed halfway and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processors_on_one_scheduler_keep_per_pod_order() {
    const PODS_N: u64 = 10_000;
    const GROUP: u64 = 8;
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    let mut events = Vec::new();
    let mut rv = 1000;
    for group in 0..PODS_N / GROUP {
        for phase in [Phase::Pending, Phase::Running, Phase::Succeeded] {
            for i in 0..GROUP {
                rv += 1;
                events.push(event(&format!("p{}", group * GROUP + i), "1", rv, phase));
            }
        }
    }
    feed.publish(events).await;

    let mut processors = vec![
        start(&nats.url(), &["1"], 16),
        start(&nats.url(), &["1"], 16),
        start(&nats.url(), &["1"], 16),
    ];
    bus::settle(
        &feed.js,
        COMMANDS,
        PODS_N / 2,
        Duration::ZERO,
        Duration::from_secs(300),
    )
    .await;
    processors.remove(0).kill().await;
    processors.push(start(&nats.url(), &["1"], 16));
    let got = wait_for_commands(&feed.js, 2 * PODS_N).await;
    for processor in processors {
        processor.stop().await;
    }

    let mut ids = HashSet::new();
    let mut per_pod: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    for (_, command) in &got {
        assert!(ids.insert(command.id.clone()), "{} twice", command.id);
        per_pod
            .entry(uid(command).to_owned())
            .or_default()
            .push(kind(command));
    }
    assert_eq!(per_pod.len() as u64, PODS_N);
    let out_of_order: Vec<_> = per_pod
        .iter()
        .filter(|(_, kinds)| kinds.as_slice() != ["running", "completed"])
        .take(5)
        .collect();
    assert!(
        out_of_order.is_empty(),
        "pods decided out of order: {out_of_order:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_event_is_dead_lettered_and_the_rest_goes_on() {
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    feed.js
        .publish(
            "podstream.pods.1.uid-garbage",
            "not protobuf \u{1}\u{2}".into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let mut no_task = event("orphan", "1", 5, Phase::Running);
    no_task.task = None;
    feed.js
        .publish(
            "podstream.pods.1.uid-orphan",
            no_task.encode_to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    feed.publish(vec![event("fine", "1", 6, Phase::Running)])
        .await;

    let processor = start(&nats.url(), &[], 256);
    let got = wait_for_commands(&feed.js, 1).await;
    let stats = processor.stop().await;
    assert_eq!(got.len(), 1);
    assert_eq!(uid(&got[0].1), "uid-fine");
    assert_eq!(stats.dead_lettered, 2);
    let dead = bus::read_all(&feed.js, DEAD).await;
    let reasons: HashMap<String, String> = dead
        .iter()
        .map(|d| {
            (
                d.header(podstream_bus::dead::SOURCE_HEADER)
                    .unwrap()
                    .to_owned(),
                d.header(podstream_bus::dead::REASON_HEADER)
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    assert!(
        reasons["podstream.pods.1.uid-garbage"].starts_with("not a PodEvent"),
        "{reasons:?}"
    );
    assert!(
        reasons["podstream.pods.1.uid-orphan"].contains("no task instance"),
        "{reasons:?}"
    );
    assert_eq!(
        dead[0].payload.as_ref(),
        b"not protobuf \x01\x02",
        "original bytes kept"
    );
}

/// Two pods for one TI decided by different instances: the duplicate record names the
/// Running pod and the loser's failure fails nothing, whichever instance saw what.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_across_instances_never_fail_the_task() {
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    let mut events = Vec::new();
    for i in 0..200u64 {
        let ti = format!("t{i}");
        let mut older = event(&format!("{ti}-a"), "1", 10 * i + 1, Phase::Running);
        let mut newer = event(&format!("{ti}-b"), "1", 10 * i + 2, Phase::Pending);
        newer.creation_unix_ms += 1000;
        let mut failed = newer.clone();
        failed.phase = Phase::Failed as i32;
        failed.resource_version = (10 * i + 3).to_string();
        for e in [&mut older, &mut newer, &mut failed] {
            e.task.as_mut().unwrap().task_id = ti.clone();
        }
        events.extend([older, newer, failed]);
    }
    feed.publish(events).await;
    let processors = [start(&nats.url(), &[], 4), start(&nats.url(), &[], 4)];
    let got = wait_for_commands(&feed.js, 400).await;
    for processor in processors {
        processor.stop().await;
    }
    let mut by_task: BTreeMap<String, Vec<(&'static str, String)>> = BTreeMap::new();
    for (_, command) in &got {
        by_task
            .entry(command.task.as_ref().unwrap().task_id.clone())
            .or_default()
            .push((kind(command), uid(command).to_owned()));
        if let Some(Kind::Duplicate(d)) = &command.kind {
            let chosen = d.chosen.as_ref().unwrap();
            assert!(
                chosen.uid.ends_with("-a"),
                "the Running pod drives: {command:?}"
            );
        }
        assert_ne!(
            kind(command),
            "fail",
            "a losing pod failed its TI: {command:?}"
        );
    }
    assert_eq!(by_task.len(), 200);
}

/// A relabel 1→2 puts a pod's events on two consumers. The processor bound to scheduler 2
/// starts first, so it meets each pod's later events before scheduler 1's processor has
/// decided the earlier ones: it must decide those first, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pods_events_stay_in_order_across_two_schedulers_consumers() {
    const PODS_N: u64 = 2_000;
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    let mut events = Vec::new();
    for i in 0..PODS_N {
        let name = format!("m{i}");
        events.push(event(&name, "1", 10 * i + 1, Phase::Running));
        events.push(event(&name, "2", 10 * i + 2, Phase::Running));
        events.push(event(&name, "2", 10 * i + 3, Phase::Succeeded));
    }
    feed.publish(events).await;

    let two = start(&nats.url(), &["2"], 64);
    bus::settle(
        &feed.js,
        COMMANDS,
        1,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    let one = start(&nats.url(), &["1"], 64);
    // Each pod's transfer is on both owners' subjects.
    let got = wait_for_commands(&feed.js, 4 * PODS_N).await;
    let (one, two) = (one.stop().await, two.stop().await);
    assert_eq!(one.decided + two.decided, 3 * PODS_N, "{one} / {two}");

    let mut per_pod: BTreeMap<String, Vec<(&'static str, String)>> = BTreeMap::new();
    for (subject, command) in &got {
        per_pod.entry(uid(command).to_owned()).or_default().push((
            kind(command),
            subject.rsplit('.').nth(1).unwrap().to_owned(),
        ));
    }
    assert_eq!(per_pod.len() as u64, PODS_N);
    let expected = vec![
        ("running", "1".to_owned()),
        ("transfer", "1".to_owned()),
        ("transfer", "2".to_owned()),
        ("completed", "2".to_owned()),
    ];
    for (pod, kinds) in &per_pod {
        assert_eq!(kinds, &expected, "{pod}");
    }
}

/// Two rounds over the same pods (Running, then Succeeded), with the processor running: the
/// commands, and the processor's counters of stream searches and record reads.
async fn two_rounds(vouched: bool, cached_records: usize) -> (Vec<(String, String)>, ProcessStats) {
    const N: u64 = 100;
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    if !vouched {
        feed = feed.unvouched();
    }
    let processor = start_with(ProcessConfig {
        bus: BusConfig::at(&nats.url()),
        cached_records,
        ..ProcessConfig::default()
    });
    for (round, phase) in [(0, Phase::Running), (1, Phase::Succeeded)] {
        let events = (0..N)
            .map(|i| event(&format!("p{i}"), "1", 100 + round * N + i, phase))
            .collect();
        feed.publish(events).await;
        wait_for_commands(&feed.js, N * (round + 1)).await;
    }
    let got = wait_for_commands(&feed.js, 2 * N).await;
    let stats = processor.stop().await;
    let mut seen: Vec<(String, String)> = got
        .iter()
        .map(|(_, c)| (uid(c).to_owned(), kind(c).to_owned()))
        .collect();
    seen.sort();
    (seen, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_the_ingest_vouches_for_spares_the_searches_and_the_cache_spares_the_reads() {
    let expected: Vec<(String, String)> = (0..100)
        .flat_map(|i| {
            [
                (format!("uid-p{i}"), "completed".to_owned()),
                (format!("uid-p{i}"), "running".to_owned()),
            ]
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    // (the ingest vouches, records cached) → (decided, searches, records read).
    let table = [
        // Each event says where its pod's previous one is, and the records stay cached: the
        // first round creates the records unread, the second finds them in the cache.
        ((true, 1024), (200, 0, 0)),
        // No cache: the second round reads each record.
        ((true, 0), (200, 0, 100)),
        // Nothing vouched for: every event searches, and a pod not known to be new has its
        // record read before the first write.
        ((false, 1024), (200, 200, 100)),
    ];
    for ((vouched, cached), want) in table {
        let (seen, stats) = two_rounds(vouched, cached).await;
        assert_eq!(seen, expected, "vouched {vouched}, cache {cached}");
        assert_eq!(
            (stats.decided, stats.searches, stats.reads),
            want,
            "vouched {vouched}, cache {cached}"
        );
    }
}

/// A TI's events that arrive together, or while its record is being written, are decided
/// together: one record write for the lot (not one per event), and the commands are those of
/// deciding them one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_instances_waiting_events_are_decided_with_one_record_write() {
    const N: u64 = 200;
    let nats = NatsServer::start();
    let mut feed = Feed::new(&nats.url()).await;
    // In the stream before the processor starts, so they arrive at once.
    let mut events: Vec<PodEvent> = (0..N)
        .map(|i| event("p", "1", 100 + i, Phase::Pending))
        .collect();
    events.push(event("p", "1", 100 + N, Phase::Running));
    events.push(event("q", "1", 100 + N + 1, Phase::Running));
    feed.publish(events).await;

    let processor = start(&nats.url(), &[], 256);
    let got = wait_for_commands(&feed.js, 2).await;
    let stats = processor.stop().await;
    let mut seen: Vec<(&str, &str)> = got.iter().map(|(_, c)| (uid(c), kind(c))).collect();
    seen.sort_unstable();
    assert_eq!(seen, [("uid-p", "running"), ("uid-q", "running")]);
    assert_eq!(stats.decided, N + 2, "{stats}");
    // Each TI's first group is whatever had arrived when it started; the rest waited for it.
    assert!(stats.writes <= 6, "{stats}");
    let mut records = feed
        .js
        .get_stream(podstream_bus::streams::bucket_stream(
            podstream_bus::streams::DEFAULT_RECORDS_BUCKET,
        ))
        .await
        .unwrap();
    let written = records.info().await.unwrap().state.last_sequence;
    assert_eq!(
        written, stats.writes,
        "the bucket's writes against the processor's count"
    );
}

/// A task record the server would refuse for its size is never retried (the lane would stall
/// for ever): the events that would grow it are dead-lettered with the reason, and other
/// task instances go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_too_large_for_the_server_is_dead_lettered_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nats-server.conf");
    // 16 KiB of it stay free for headers: records of 4 KiB at most.
    std::fs::write(&config, "max_payload: 20480\n").unwrap();
    let nats = NatsServer::start_with_config(&config, &[]);
    let mut feed = Feed::new(&nats.url()).await;
    let copies: Vec<PodEvent> = (0..80)
        .map(|n| {
            bus::pod_event(
                "crowded",
                &format!("crowded-copy-{n:03}-with-a-long-name-as-operators-make"),
                "1",
                100 + n,
                Phase::Running,
            )
        })
        .collect();
    feed.publish(copies).await;
    let processor = start(&nats.url(), &[], 8);
    bus::settle(
        &feed.js,
        DEAD,
        1,
        Duration::from_millis(500),
        Duration::from_secs(60),
    )
    .await;
    feed.publish(vec![event("fine", "1", 1000, Phase::Running)])
        .await;
    let got = bus::settle(
        &feed.js,
        COMMANDS,
        1,
        Duration::from_millis(500),
        Duration::from_secs(60),
    )
    .await;
    let stats = processor.stop().await;
    let commands = commands(&bus::read_all(&feed.js, COMMANDS).await);
    assert!(got >= 1);
    assert!(
        commands.iter().any(|(_, c)| uid(c) == "uid-fine"),
        "the other TI was decided"
    );
    let dead = bus::read_all(&feed.js, DEAD).await;
    assert!(!dead.is_empty());
    assert_eq!(stats.dead_lettered, dead.len() as u64);
    for letter in &dead {
        let reason = letter.header(podstream_bus::dead::REASON_HEADER).unwrap();
        assert!(reason.contains("task record would be"), "{reason}");
        assert!(
            letter
                .pod_event()
                .pod
                .unwrap()
                .name
                .starts_with("crowded-copy-")
        );
    }
}

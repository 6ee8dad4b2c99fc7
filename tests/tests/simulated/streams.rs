//! Stream settings have one owner per setting: what a component is not given it leaves as
//! the stream has it, what it is given it applies; the sink keeps applied ids as long as
//! the commands stream, as the server has it, keeps commands. A real nats-server.

use std::time::Duration;

use async_nats::jetstream;
use podstream_bus::BusConfig;
use podstream_bus::streams::{self, StreamSettings};
use podstream_proto::subject::stream_names;
use podstream_proto::subject::{Stream, Subjects};
use podstream_sink::Database;
use podstream_sink::service::{self, SinkConfig, SinkError};
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::nats::NatsServer;

const HOUR: Duration = Duration::from_secs(3600);

async fn commands_stream(
    js: &jetstream::Context,
    settings: &StreamSettings,
) -> jetstream::stream::Config {
    streams::ensure(
        js,
        streams::stream_config(&Subjects::default(), Stream::Commands, settings),
    )
    .await
    .unwrap()
}

async fn on_server(js: &jetstream::Context) -> jetstream::stream::Config {
    js.get_stream(stream_names::COMMANDS)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone()
}

#[tokio::test]
async fn a_setting_not_given_is_left_as_the_stream_has_it_and_one_given_is_applied() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let created = commands_stream(&js, &StreamSettings::default()).await;
    assert_eq!(created.max_age, podstream_bus::config::default_max_age());

    let operator = StreamSettings {
        max_age: Some(2 * HOUR),
        duplicate_window: Some(Duration::from_secs(60)),
        ..StreamSettings::default()
    };
    let changed = commands_stream(&js, &operator).await;
    assert_eq!(
        (changed.max_age, changed.duplicate_window),
        (2 * HOUR, Duration::from_secs(60))
    );

    // Another component started with the defaults leaves the operator's choice alone.
    let kept = commands_stream(&js, &StreamSettings::default()).await;
    assert_eq!(
        (kept.max_age, kept.duplicate_window),
        (2 * HOUR, Duration::from_secs(60))
    );
    let server = on_server(&js).await;
    assert_eq!(
        (server.max_age, server.duplicate_window),
        (2 * HOUR, Duration::from_secs(60))
    );

    // Zero is JetStream's "forever", and is applied like any other value.
    let forever = StreamSettings {
        max_age: Some(Duration::ZERO),
        ..StreamSettings::default()
    };
    assert_eq!(commands_stream(&js, &forever).await.max_age, Duration::ZERO);
    assert_eq!(on_server(&js).await.max_age, Duration::ZERO);

    // A size cap, given, is applied; not given, left; 0 lifts it.
    let capped = StreamSettings {
        max_bytes: Some(64 * 1024 * 1024),
        ..StreamSettings::default()
    };
    assert_eq!(
        commands_stream(&js, &capped).await.max_bytes,
        64 * 1024 * 1024
    );
    assert_eq!(
        commands_stream(&js, &StreamSettings::default())
            .await
            .max_bytes,
        64 * 1024 * 1024
    );
    let uncapped = StreamSettings {
        max_bytes: Some(0),
        ..StreamSettings::default()
    };
    commands_stream(&js, &uncapped).await;
    assert_eq!(on_server(&js).await.max_bytes, -1);
}

/// With a size cap, the oldest messages go first once the stream holds more.
#[tokio::test]
async fn a_stream_capped_in_bytes_drops_its_oldest_messages() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let capped = StreamSettings {
        max_bytes: Some(64 * 1024),
        ..StreamSettings::default()
    };
    commands_stream(&js, &capped).await;
    for i in 0..200u32 {
        js.publish(
            format!("podstream.commands.1.u{i}"),
            vec![b'x'; 1024].into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let mut stream = js.get_stream(stream_names::COMMANDS).await.unwrap();
    let state = stream.info().await.unwrap().state.clone();
    assert!(state.bytes <= 64 * 1024, "{state:?}");
    assert!(state.first_sequence > 1, "the oldest went: {state:?}");
    assert_eq!(state.last_sequence, 200);
}

async fn sink_with(nats: &NatsServer, retention_hours: Option<u64>) -> Result<(), SinkError> {
    let applied_retention = retention_hours.map(|hours| Duration::from_secs(hours * 3600));
    let target = AirflowDb::sqlite(Airflow::oldest());
    let db = Database::connect(&target.url).await.unwrap();
    let config = SinkConfig {
        bus: BusConfig::at(&nats.url()),
        applied_retention,
        ..SinkConfig::default()
    };
    // A sink that starts runs until stopped: stop it once it is pulling.
    service::run(config, db, tokio::time::sleep(Duration::from_secs(1)))
        .await
        .map(drop)
}

#[tokio::test]
async fn the_sink_keeps_applied_ids_as_long_as_the_stream_as_it_is_keeps_commands() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    // Somebody made the commands stream keep commands forever; the sink is not told.
    let forever = StreamSettings {
        max_age: Some(Duration::ZERO),
        ..StreamSettings::default()
    };
    commands_stream(&js, &forever).await;

    let refused = sink_with(&nats, Some(24)).await.unwrap_err();
    assert!(matches!(refused, SinkError::Retention(_)), "{refused:?}");
    let message = refused.to_string();
    assert!(
        message.contains("forever") && message.contains("24 h"),
        "{message}"
    );
    sink_with(&nats, None)
        .await
        .expect("the default keeps ids forever too");
    sink_with(&nats, Some(0)).await.expect("0 is forever");
    assert_eq!(
        on_server(&js).await.max_age,
        Duration::ZERO,
        "the sink left the stream as it was"
    );

    // A stream kept two hours: a day of ids is enough.
    let two_hours = StreamSettings {
        max_age: Some(2 * HOUR),
        ..StreamSettings::default()
    };
    commands_stream(&js, &two_hours).await;
    sink_with(&nats, Some(24))
        .await
        .expect("24 h outlives a 2 h stream");
}

/// Rounds of eight components starting at once, each on its own connection: `start` is what
/// each one does in round `round`, and every one must succeed.
async fn rounds_of_eight_at_once<T, E, Fut>(
    nats: &NatsServer,
    start: impl Fn(jetstream::Context, usize) -> Fut,
) -> Vec<Vec<T>>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
    Fut: std::future::Future<Output = Result<T, E>> + Send + 'static,
{
    let mut rounds = Vec::new();
    for round in 0..20 {
        let mut starting = Vec::new();
        for _ in 0..8 {
            let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
            starting.push(tokio::spawn(start(js, round)));
        }
        let mut started = Vec::new();
        for start in starting {
            let result = start.await.unwrap();
            started.push(result.unwrap_or_else(|e| panic!("round {round}: {e}")));
        }
        rounds.push(started);
    }
    rounds
}

/// The subjects of round `round`, so each round races on a stream of its own.
fn race_subjects(round: usize) -> Subjects {
    Subjects::new(&format!("race{round}")).unwrap()
}

/// Components started together each ensure the same streams at once (ingest and the
/// processor both need the pod-events stream): every one of them gets the stream, none
/// fails on the others' creating it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_creating_one_stream_at_once_all_get_it() {
    let nats = NatsServer::start();
    let rounds = rounds_of_eight_at_once(&nats, |js, round| async move {
        let wanted = streams::stream_config(
            &race_subjects(round),
            Stream::PodEvents,
            &StreamSettings::default(),
        );
        streams::ensure(&js, wanted).await
    })
    .await;
    for (round, configs) in rounds.iter().enumerate() {
        for config in configs {
            assert_eq!(
                config.name,
                race_subjects(round).stream_name(Stream::PodEvents)
            );
        }
    }
}

/// Processor instances started together each open the state bucket at once: every one of
/// them gets it, none fails on the others' creating it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_opening_one_bucket_at_once_all_get_it() {
    let nats = NatsServer::start();
    let rounds = rounds_of_eight_at_once(&nats, |js, round| async move {
        let wanted = jetstream::kv::Config {
            bucket: format!("race-{round}"),
            ..Default::default()
        };
        streams::bucket(&js, wanted).await
    })
    .await;
    for (round, stores) in rounds.iter().enumerate() {
        for store in stores {
            assert_eq!(store.name, format!("race-{round}"));
        }
    }
}

#[tokio::test]
async fn history_reads_every_message_in_order_across_batches_gaps_and_bounds() {
    use podstream_bus::history::{BATCH, History, Start};
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    // A stream made before podstream asked for direct gets gets them on its next start.
    let mut old = streams::stream_config(
        &Subjects::default(),
        Stream::Commands,
        &StreamSettings::default(),
    )
    .config;
    old.allow_direct = false;
    js.create_stream(old).await.unwrap();
    assert!(
        commands_stream(&js, &StreamSettings::default())
            .await
            .allow_direct
    );

    let total = (BATCH * 2 + 17) as u64;
    for n in 1..=total {
        js.publish(
            format!("podstream.commands.1.uid-{n}"),
            n.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let stream = js.get_stream(stream_names::COMMANDS).await.unwrap();
    for gap in [3, BATCH as u64, BATCH as u64 + 1] {
        stream.delete_message(gap).await.unwrap();
    }
    let read = async |start: Start, last: u64| -> Vec<u64> {
        let mut history = History::new(&client, stream_names::COMMANDS, start, last);
        let mut sequences = Vec::new();
        while let Some(message) = history.next().await.unwrap() {
            assert_eq!(
                message.payload.as_ref(),
                message.sequence.to_string().as_bytes()
            );
            sequences.push(message.sequence);
        }
        sequences
    };
    let expected = |from: u64, to: u64| -> Vec<u64> {
        (from..=to)
            .filter(|n| ![3, BATCH as u64, BATCH as u64 + 1].contains(n))
            .collect()
    };
    assert_eq!(read(Start::Sequence(1), total).await, expected(1, total));
    assert_eq!(read(Start::Sequence(2), 300).await, expected(2, 300));
    assert_eq!(
        read(Start::Sequence(total + 1), total + 5).await,
        Vec::<u64>::new()
    );
    // By time: from the first message's time on, all of them; from now on, none.
    let first = stream.direct_get(1).await.unwrap().time;
    assert_eq!(read(Start::Time(first), total).await, expected(1, total));
    let later = time::OffsetDateTime::now_utc() + Duration::from_secs(60);
    assert_eq!(read(Start::Time(later), total).await, Vec::<u64>::new());
}

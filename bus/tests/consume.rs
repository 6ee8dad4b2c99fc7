//! The consumer loop on a real nats-server: what it hands over, in what order, what it
//! dead-letters or acks unhandled, and what happens to what it holds when it stops.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use podstream_bus::consume::{
    Consumed, ConsumerLoop, DeadLetters, Decoded, Delivery, Handler, HandlerStopped, Pulling,
    Sharing, ack,
};
use podstream_bus::local_server::{LocalServer, find_binary, free_port};
use podstream_bus::{BusConfig, Health, InFlight, OnTheBus};
use podstream_proto::subject::{Role, Stage, Stream};

/// Takes words; each finished one is acked `pace` later (as a commit, then its ack), and
/// counted.
struct Words {
    waiting: Vec<Delivery<String>>,
    finished: Vec<String>,
    count: Arc<AtomicUsize>,
    room: usize,
    pace: Duration,
}

impl Words {
    fn new(room: usize, pace: Duration) -> Words {
        Words {
            waiting: Vec::new(),
            finished: Vec::new(),
            count: Arc::new(AtomicUsize::new(0)),
            room,
            pace,
        }
    }
}

impl Handler for Words {
    type Item = String;
    type Done = Delivery<String>;

    fn decode(&self, message: &jetstream::Message) -> Decoded<String> {
        match std::str::from_utf8(&message.payload) {
            Ok(word) if word.chars().all(|c| c.is_ascii_lowercase()) => {
                Decoded::Item(word.to_owned())
            }
            _ => Decoded::Dead("not a word".to_owned()),
        }
    }

    fn has_room(&self) -> bool {
        self.waiting.len() < self.room
    }

    async fn take(&mut self, deliveries: Vec<Delivery<String>>) -> Result<(), HandlerStopped> {
        self.waiting.extend(deliveries);
        Ok(())
    }

    async fn finished(&mut self) -> Option<Delivery<String>> {
        if self.waiting.is_empty() {
            return None;
        }
        Some(self.waiting.remove(0))
    }

    /// Waits (as a database commit would) before the ack: the loop must not drop it halfway.
    async fn after(&mut self, delivery: Delivery<String>) {
        tokio::time::sleep(self.pace).await;
        ack(&delivery.message).await;
        self.finished.push(delivery.item);
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

struct Bus {
    _dir: tempfile::TempDir,
    _server: LocalServer,
    on: OnTheBus,
    consumer: jetstream::consumer::PullConsumer,
}

/// A nats-server, the commands and dead-letter streams, and a shared consumer with an ack
/// wait of `ack_wait`.
async fn bus(ack_wait: Duration) -> Bus {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let server = LocalServer::start(&find_binary(), dir.path(), port).unwrap();
    let config = BusConfig {
        nats_url: server.url(),
        ..BusConfig::default()
    };
    let on = podstream_bus::start(
        &config,
        "consume-test",
        &[Stream::Commands, Stream::DeadLetters],
    )
    .await
    .unwrap();
    let stream = on.js.get_stream(&on.streams[0].name).await.unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("words".to_owned()),
            filter_subject: on.subjects.commands_filter(None),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await
        .unwrap();
    Bus {
        _dir: dir,
        _server: server,
        on,
        consumer,
    }
}

impl Bus {
    fn consumer_loop(&self, batch_size: usize, ack_wait: Duration) -> ConsumerLoop {
        ConsumerLoop {
            consumer: self.consumer.clone(),
            sharing: Sharing::Shared,
            pulling: Pulling {
                batch_size,
                in_flight: InFlight::start(self.on.js.client(), ack_wait),
                health: Health::new(),
            },
            dead: DeadLetters {
                js: self.on.js.clone(),
                subjects: self.on.subjects.clone(),
                stage: Stage::Sink,
            },
        }
    }

    async fn publish(&self, payload: &str, notice: bool) {
        let subject = self.on.subjects.commands("1", "uid-1");
        let ack = if notice {
            let headers = podstream_bus::role::headers(Role::Left);
            self.on
                .js
                .publish_with_headers(subject, headers, payload.to_owned().into())
                .await
        } else {
            self.on.js.publish(subject, payload.to_owned().into()).await
        };
        ack.unwrap().await.unwrap();
    }

    async fn dead_letters(&self) -> u64 {
        let mut stream = self
            .on
            .js
            .get_stream(&self.on.streams[1].name)
            .await
            .unwrap();
        stream.info().await.unwrap().state.messages
    }

    async fn unacked(&self) -> u64 {
        let mut consumer = self.consumer.clone();
        let info = consumer.info().await.unwrap();
        info.num_ack_pending as u64 + info.num_pending
    }
}

/// `n` distinct words in sorted order: `waa`, `wab`, …
fn words(n: u16) -> Vec<String> {
    (0..n)
        .map(|i| {
            let [a, b] = [(i / 26) as u8, (i % 26) as u8];
            format!("w{}{}", char::from(b'a' + a), char::from(b'a' + b))
        })
        .collect()
}

/// Runs `handler` until `count` of its finished items reach `until`, then stops it.
async fn run_until(
    consumer: &ConsumerLoop,
    handler: &mut Words,
    until: usize,
) -> Result<Consumed, HandlerStopped> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let count = Arc::clone(&handler.count);
    let stopper = tokio::spawn(async move {
        for _ in 0..500 {
            if count.load(Ordering::SeqCst) >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(true);
    });
    let consumed = consumer.run(handler, stopped).await;
    stopper.abort();
    consumed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn words_are_handed_over_in_order_and_the_rest_is_dead_lettered_or_acked() {
    let ack_wait = Duration::from_secs(60);
    let bus = bus(ack_wait).await;
    bus.publish("alpha", false).await;
    bus.publish("NOT A WORD", false).await;
    bus.publish("left", true).await;
    for word in ["bravo", "charlie", "delta"] {
        bus.publish(word, false).await;
    }
    let consumer = bus.consumer_loop(2, ack_wait);
    let mut words = Words::new(1, Duration::ZERO);
    let consumed = run_until(&consumer, &mut words, 4).await.unwrap();
    assert_eq!(words.finished, ["alpha", "bravo", "charlie", "delta"]);
    assert_eq!(
        consumed,
        Consumed {
            dead_lettered: 1,
            notices: 1
        }
    );
    assert_eq!(bus.dead_letters().await, 1);
    assert_eq!(bus.unacked().await, 0, "every message was acked");
}

/// On stop, what was handed over is finished and acked, and what was not comes back (given
/// back at once, or after the ack wait when it was still on its way): the next loop takes it,
/// and nothing is handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_loop_finishes_what_it_holds_and_gives_back_the_rest() {
    let ack_wait = Duration::from_secs(2);
    let bus = bus(ack_wait).await;
    let all = words(30);
    for word in &all {
        bus.publish(word, false).await;
    }
    let consumer = bus.consumer_loop(5, ack_wait);
    let mut first = Words::new(5, Duration::from_millis(50));
    run_until(&consumer, &mut first, 1).await.unwrap();
    assert!(
        (1..all.len()).contains(&first.finished.len()),
        "stopped early: {:?}",
        first.finished
    );
    let mut second = Words::new(100, Duration::ZERO);
    let left = all.len() - first.finished.len();
    tokio::time::timeout(
        Duration::from_secs(20),
        run_until(&consumer, &mut second, left),
    )
    .await
    .expect("the rest came back")
    .unwrap();
    // A word given back is delivered again after those behind it: once each, not in order.
    let mut seen = first.finished.clone();
    seen.extend(second.finished.iter().cloned());
    seen.sort();
    assert_eq!(seen, all, "each word once");
    assert_eq!(bus.unacked().await, 0);
}

/// What follows a finished piece (here a wait, then the ack, as a commit then its acks) runs
/// to its end while messages keep arriving: no ack is lost to a message that came first, so
/// nothing comes back after the ack wait to be handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_after_a_finished_piece_are_never_dropped_for_a_new_message() {
    let ack_wait = Duration::from_secs(2);
    let bus = bus(ack_wait).await;
    let all = words(200);
    let consumer = bus.consumer_loop(5, ack_wait);
    let mut words = Words::new(1000, Duration::from_millis(3));
    let publishing = {
        let js = bus.on.js.clone();
        let subject = bus.on.subjects.commands("1", "uid-1");
        let all = all.clone();
        tokio::spawn(async move {
            for word in all {
                js.publish(subject.clone(), word.into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    // Every word, then long enough past the ack wait for a lost ack's redelivery to show.
    run_until(&consumer, &mut words, all.len()).await.unwrap();
    publishing.await.unwrap();
    let mut again = Words::new(1000, Duration::ZERO);
    run_until_quiet(&consumer, &mut again, ack_wait * 2).await;
    assert_eq!(words.finished, all, "each word once, in order");
    assert!(
        again.finished.is_empty(),
        "redelivered: {:?}",
        again.finished
    );
    assert_eq!(bus.unacked().await, 0);
}

/// Runs `handler` for `quiet`, then stops it.
async fn run_until_quiet(consumer: &ConsumerLoop, handler: &mut Words, quiet: Duration) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(quiet).await;
        let _ = stop.send(true);
    });
    consumer.run(handler, stopped).await.unwrap();
    stopper.await.unwrap();
}

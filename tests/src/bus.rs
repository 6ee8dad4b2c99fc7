//! Reading what podstream wrote to JetStream, for assertions.

use std::time::{Duration, Instant};

use std::collections::VecDeque;

use async_nats::jetstream::{
    self, consumer::pull::OrderedConfig, context::PublishAckFuture, message::PublishMessage,
};
use futures::StreamExt;
use podstream_bus::streams::{self, StreamSettings};
use podstream_ingest::known::{KnownPods, Outgoing, Sighting};
use podstream_proto::PodEvent;
use podstream_proto::subject::{Stream, Subjects};
use prost::Message as _;

/// One stored message, decoded as far as the tests care.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Stream sequence.
    pub sequence: u64,
    /// Subject.
    pub subject: String,
    /// Headers as (name, value) pairs.
    pub headers: Vec<(String, String)>,
    /// The raw payload.
    pub payload: bytes::Bytes,
    /// When JetStream stored it, Unix seconds.
    pub published: f64,
}

impl Stored {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The payload as a `PodEvent`.
    ///
    /// # Panics
    /// When it is not one.
    pub fn pod_event(&self) -> PodEvent {
        PodEvent::decode(self.payload.as_ref())
            .unwrap_or_else(|e| panic!("seq {} is not a PodEvent: {e}", self.sequence))
    }
}

/// How many messages a stream holds now (0 when it does not exist yet).
pub async fn count(js: &jetstream::Context, stream: &str) -> u64 {
    match js.get_stream(stream).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Waits until the stream holds at least `n` messages and then no more arrive for `quiet`.
///
/// # Panics
/// After `timeout`.
pub async fn settle(
    js: &jetstream::Context,
    stream: &str,
    n: u64,
    quiet: Duration,
    timeout: Duration,
) -> u64 {
    let started = Instant::now();
    let mut last = u64::MAX;
    let mut since = Instant::now();
    loop {
        let now = count(js, stream).await;
        if now != last {
            last = now;
            since = Instant::now();
        }
        if now >= n && since.elapsed() >= quiet {
            return now;
        }
        assert!(
            started.elapsed() < timeout,
            "stream {stream} holds {now} messages, expected at least {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every message of a stream, in order.
///
/// # Panics
/// When the stream cannot be read.
pub async fn read_all(js: &jetstream::Context, stream: &str) -> Vec<Stored> {
    let total = count(js, stream).await;
    let mut out = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    if total == 0 {
        return out;
    }
    let stream = js
        .get_stream(stream)
        .await
        .unwrap_or_else(|e| panic!("stream {stream}: {e}"));
    let consumer = stream
        .create_consumer(OrderedConfig::default())
        .await
        .unwrap_or_else(|e| panic!("ordered consumer: {e}"));
    let mut messages = consumer
        .messages()
        .await
        .unwrap_or_else(|e| panic!("messages: {e}"));
    while (out.len() as u64) < total {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .unwrap_or_else(|_| panic!("timed out reading message {} of {total}", out.len() + 1))
            .unwrap_or_else(|| panic!("stream ended early"))
            .unwrap_or_else(|e| panic!("reading: {e}"));
        let (sequence, published) = message
            .info()
            .map(|i| {
                (
                    i.stream_sequence,
                    i.published.unix_timestamp_nanos() as f64 / 1e9,
                )
            })
            .unwrap_or_default();
        let headers = message
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .flat_map(|(name, values)| {
                        values
                            .iter()
                            .map(move |v| (name.to_string(), v.to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Stored {
            sequence,
            subject: message.subject.to_string(),
            headers,
            payload: message.payload.clone(),
            published,
        });
    }
    out
}

/// Publishes pod events the way the ingest does: through its core, so owner changes also
/// send the `left` notice, with its message ids and headers.
pub struct PodFeed {
    /// The JetStream context it publishes with.
    pub js: jetstream::Context,
    known: KnownPods,
    subjects: Subjects,
    sighting: Sighting,
}

impl PodFeed {
    /// Connects to `url` and makes sure of the pod-events stream.
    ///
    /// # Panics
    /// When NATS is unreachable.
    pub async fn new(url: &str) -> PodFeed {
        let js = jetstream::new(
            async_nats::connect(url)
                .await
                .unwrap_or_else(|e| panic!("connecting to {url}: {e}")),
        );
        let settings = podstream_bus::StreamSettings::default();
        podstream_bus::streams::ensure(
            &js,
            podstream_bus::streams::stream_config(
                &Subjects::default(),
                Stream::PodEvents,
                &settings,
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("pod-events stream: {e}"));
        PodFeed {
            js,
            known: KnownPods::new(),
            subjects: Subjects::default(),
            sighting: Sighting::Watch,
        }
    }

    /// From now on, publishes as an ingest that cannot vouch for any pod's previous event
    /// (an older ingest, or its first list after a restart): no `previous_sequence`.
    pub fn unvouched(mut self) -> PodFeed {
        self.sighting = Sighting::Listing;
        self
    }

    /// Publishes `events` in order and waits for every ack. Like the ingest's live watch, it
    /// tells each event where the pod's previous one went when that ack has come back
    /// (unless [`PodFeed::unvouched`]).
    ///
    /// # Panics
    /// When JetStream refuses.
    pub async fn publish(&mut self, events: Vec<PodEvent>) {
        let mut acks = Vec::new();
        for event in events {
            for out in self.known.observe(&self.subjects, event, self.sighting) {
                let ack = self
                    .js
                    .send_publish(out.subject.clone(), out.to_publish())
                    .await
                    .unwrap_or_else(|e| panic!("publishing: {e}"));
                acks.push((out, ack));
            }
            if acks.len() >= 512 {
                self.settle(acks.drain(..)).await;
            }
        }
        self.settle(acks.into_iter()).await;
    }

    async fn settle(&mut self, acks: impl Iterator<Item = (Outgoing, PublishAckFuture)>) {
        for (out, ack) in acks {
            let ack = ack.await.unwrap_or_else(|e| panic!("publish ack: {e}"));
            if self.sighting == Sighting::Watch {
                self.known.acked(&out, ack.sequence);
            }
        }
    }
}

/// What the raw baseline's messages look like besides their size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawShape {
    /// Short subjects (`rawbench.pods.<n>.u<i>`) and a message id.
    Bare,
    /// The ingest's: a uid on the subject (`rawingest.pods.<n>.<uuid>`), a message id of the
    /// same form, and the `Podstream-Role` header.
    LikeIngest,
}

/// The raw JetStream publish limit, messages per second: `n` messages of `size` bytes with
/// message ids, `window` acks outstanding, to a stream of its own with the pod stream's
/// settings. The baseline the benches report podstream's figures against.
///
/// # Panics
/// When JetStream refuses.
pub async fn raw_publish_limit(
    js: &jetstream::Context,
    n: usize,
    size: usize,
    window_size: usize,
    shape: RawShape,
) -> f64 {
    let prefix = match shape {
        RawShape::Bare => "rawbench",
        RawShape::LikeIngest => "rawingest",
    };
    let subjects = Subjects::new(prefix).unwrap_or_else(|e| panic!("{e}"));
    let mut wanted =
        streams::stream_config(&subjects, Stream::PodEvents, &StreamSettings::default());
    wanted.config.subjects = vec![format!("{prefix}.>")];
    // A stream left by an earlier run would take these ids as duplicates and store nothing.
    let _ = js.delete_stream(&wanted.config.name).await;
    streams::ensure(js, wanted)
        .await
        .unwrap_or_else(|e| panic!("raw publish: {e}"));
    let payload = bytes::Bytes::from(vec![7u8; size]);
    let mut window: VecDeque<PublishAckFuture> = VecDeque::new();
    let started = Instant::now();
    for i in 0..n {
        if window.len() >= window_size
            && let Some(ack) = window.pop_front()
        {
            ack.await.unwrap_or_else(|e| panic!("raw publish: {e}"));
        }
        let (subject, message) = match shape {
            RawShape::Bare => (
                format!("{prefix}.pods.{}.u{i}", i % 4),
                PublishMessage::build()
                    .payload(payload.clone())
                    .message_id(format!("raw-{i}:1:changed")),
            ),
            RawShape::LikeIngest => {
                let uid = format!("00000000-0000-0000-0000-{i:012}");
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(podstream_proto::subject::ROLE_HEADER, "event");
                (
                    format!("{prefix}.pods.{}.{uid}", 1 + i % 4),
                    PublishMessage::build()
                        .headers(headers)
                        .payload(payload.clone())
                        .message_id(format!("{uid}:1:changed")),
                )
            }
        };
        window.push_back(
            js.send_publish(subject, message)
                .await
                .unwrap_or_else(|e| panic!("raw publish: {e}")),
        );
    }
    for ack in window {
        ack.await.unwrap_or_else(|e| panic!("raw publish: {e}"));
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// A `PodEvent` as the ingest would publish it: pod `name` (uid `uid-<name>`) in namespace
/// `airflow`, owned by `owner`, running try 1 of `etl/<task_id>/manual__2026-11-30`.
pub fn pod_event(
    task_id: &str,
    name: &str,
    owner: &str,
    resource_version: u64,
    phase: podstream_proto::v1::Phase,
) -> PodEvent {
    PodEvent {
        r#type: podstream_proto::v1::EventType::Modified as i32,
        pod: Some(podstream_proto::PodRef {
            namespace: "airflow".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }),
        owner: owner.into(),
        task: Some(podstream_sink::seed::first_try(
            "etl",
            task_id,
            "manual__2026-11-30",
        )),
        phase: phase as i32,
        creation_unix_ms: 1_764_000_000_000,
        resource_version: resource_version.to_string(),
        ..PodEvent::default()
    }
}

//! Publishing with a bounded window of in-flight acks. A message counts as published only once
//! JetStream acked it; on a failure, it and every later message in the window are published
//! again, in order, until acked (their `Nats-Msg-Id`s make the repeats harmless).
//!
//! A pod never has two messages in flight: its next one waits for the last one's ack. When a
//! stream leader dies, the messages it had not yet replicated are lost, and their loss shows
//! only when their acks time out; a later message of the same pod sent meanwhile would be
//! stored first, and the pod's events would be out of order (a transfer read as a first
//! sighting). Different pods still share the window.

use std::collections::VecDeque;
use std::time::Duration;

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use async_nats::jetstream::{
    self, context::PublishError, message::PublishMessage, publish::PublishAck,
};
use futures::FutureExt;
use podstream_bus::Backoff;
use podstream_bus::dead::DeadLetter;

use crate::known::{FastHash, Outgoing, uid};
use crate::leadership::Fence;
use crate::spark::SparkOutgoing;

/// A message for the bus: a pod event, a Spark object's event, or a dead letter.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A pod event or owner notice.
    Pod(Box<Outgoing>),
    /// A Spark driver pod's or SparkApplication's event.
    Spark(Box<SparkOutgoing>),
    /// An item that could not be projected.
    Dead(DeadLetter),
}

impl Message {
    /// The object it is about; a dead letter is ordered with nothing.
    fn pod(&self) -> Option<&str> {
        match self {
            Message::Pod(out) => Some(uid(&out.event)),
            Message::Spark(out) => Some(out.uid()),
            Message::Dead(_) => None,
        }
    }

    fn subject(&self) -> &str {
        match self {
            Message::Pod(out) => &out.subject,
            Message::Spark(out) => &out.subject,
            Message::Dead(dead) => &dead.subject,
        }
    }

    /// The message to publish through `js` (a dead letter cut to the server's max payload).
    fn to_publish(&self, js: &jetstream::Context) -> PublishMessage {
        match self {
            Message::Pod(out) => out.to_publish(),
            Message::Spark(out) => out.to_publish(),
            Message::Dead(dead) => dead.to_publish(js.client().server_info().max_payload),
        }
    }
}

/// A message JetStream has stored, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Acked {
    /// The message.
    pub message: Message,
    /// Its stream sequence (the original's, when JetStream dropped it as a duplicate).
    pub sequence: u64,
}

type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

struct InFlight {
    message: Message,
    ack: AckFuture,
    sent: std::time::Instant,
}

/// Records how long an ack took since its message was `sent`.
fn record_ack_latency(sent: std::time::Instant) {
    metrics::histogram!(podstream_bus::metrics::INGEST_PUBLISH_ACK_SECONDS)
        .record(sent.elapsed().as_secs_f64());
}

/// Publishes in order, with at most `window` messages awaiting their ack.
///
/// Acked messages collect in the publisher, oldest first, until [`Publisher::take_acked`].
/// Its futures stay small on purpose: the publishing loop awaits one per event, and a
/// future is moved whole each time it is made, so the rare recovery path is boxed.
pub struct Publisher {
    js: jetstream::Context,
    window: usize,
    in_flight: VecDeque<InFlight>,
    /// Pods with a message in `in_flight` (at most one each).
    pods_in_flight: std::collections::HashSet<String, FastHash>,
    acked: Vec<Acked>,
    duplicates: u64,
    /// Nothing is sent once it closes.
    fence: Fence,
    deposed: bool,
}

impl Publisher {
    /// A publisher on a JetStream context that sends only while `fence` holds.
    pub fn new(js: jetstream::Context, window: usize, fence: Fence) -> Publisher {
        Publisher {
            js,
            window: window.max(1),
            in_flight: VecDeque::new(),
            pods_in_flight: Default::default(),
            acked: Vec::new(),
            duplicates: 0,
            fence,
            deposed: false,
        }
    }

    /// Messages JetStream reported as duplicates (re-publishes it dropped).
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// The messages acked since the last call, oldest first. Dropping the iterator before
    /// its end drops the rest with it, so take them all.
    pub fn take_acked(&mut self) -> std::vec::Drain<'_, Acked> {
        self.acked.drain(..)
    }

    /// Whether the fence closed: messages were dropped unsent since, and the ingest must stop.
    pub fn deposed(&self) -> bool {
        self.deposed
    }

    /// `false` (and deposed from now on) once the fence closed.
    fn may_send(&mut self) -> bool {
        if !self.deposed && !self.fence.holds() {
            tracing::warn!("the write fence closed; publishing stops");
            self.deposed = true;
        }
        !self.deposed
    }

    /// Sends a message, first waiting for the oldest acks while the window is full. Once the
    /// fence closed, the message is dropped: a deposed leader publishes nothing.
    pub async fn publish(&mut self, message: Message) {
        while self.in_flight.len() >= self.window
            || message
                .pod()
                .is_some_and(|pod| self.pods_in_flight.contains(pod))
        {
            if self.in_flight.is_empty() {
                self.pods_in_flight.clear();
                break;
            }
            self.settle_oldest().await;
        }
        if !self.may_send() {
            return;
        }
        let sent = self
            .js
            .send_publish(message.subject().to_owned(), message.to_publish(&self.js))
            .await;
        match sent {
            Ok(ack) => {
                if let Some(pod) = message.pod() {
                    self.pods_in_flight.insert(pod.to_owned());
                }
                self.in_flight.push_back(InFlight {
                    message,
                    ack: Box::pin(ack.into_future()),
                    sent: std::time::Instant::now(),
                });
            }
            Err(error) => {
                tracing::warn!(subject = message.subject(), %error, "publish failed; retrying in order");
                Box::pin(self.recover(None, Some(message))).await;
            }
        }
    }

    /// Collects the acks that have arrived, without waiting for the others.
    pub async fn poll_acked(&mut self) {
        while let Some(oldest) = self.in_flight.front_mut() {
            match (&mut oldest.ack).now_or_never() {
                None => break,
                Some(Ok(ack)) => {
                    if let Some(done) = self.pop_oldest() {
                        record_ack_latency(done.sent);
                        self.settled(done.message, &ack);
                    }
                }
                Some(Err(error)) => {
                    let Some(failed) = self.pop_oldest() else {
                        break;
                    };
                    tracing::warn!(subject = failed.message.subject(), %error, "publish not acked; republishing the window in order");
                    Box::pin(self.recover(Some(failed.message), None)).await;
                }
            }
        }
    }

    /// The oldest message in flight, its pod no longer counted in flight.
    fn pop_oldest(&mut self) -> Option<InFlight> {
        let oldest = self.in_flight.pop_front()?;
        if let Some(pod) = oldest.message.pod() {
            self.pods_in_flight.remove(pod);
        }
        Some(oldest)
    }

    /// Waits for every in-flight ack.
    pub async fn drain(&mut self) {
        while !self.in_flight.is_empty() {
            self.settle_oldest().await;
        }
    }

    async fn settle_oldest(&mut self) {
        let Some(oldest) = self.pop_oldest() else {
            return;
        };
        let sent = oldest.sent;
        match oldest.ack.await {
            Ok(ack) => {
                record_ack_latency(sent);
                self.settled(oldest.message, &ack);
            }
            Err(error) => {
                tracing::warn!(subject = oldest.message.subject(), %error, "publish not acked; republishing the window in order");
                Box::pin(self.recover(Some(oldest.message), None)).await;
            }
        }
    }

    /// Publishes `first`, every in-flight message, then `last` again, in that order, one at a
    /// time, each until acked.
    async fn recover(&mut self, first: Option<Message>, last: Option<Message>) {
        let mut pending: Vec<Message> = first.into_iter().collect();
        pending.extend(self.in_flight.drain(..).map(|f| f.message));
        // Each is sent only after the one before it is acked: nothing of theirs is in flight.
        self.pods_in_flight.clear();
        pending.extend(last);
        for message in pending {
            let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
            let ack = loop {
                if !self.may_send() {
                    return;
                }
                let attempt = async {
                    let ack = self
                        .js
                        .send_publish(message.subject().to_owned(), message.to_publish(&self.js))
                        .await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(ack.await?)
                };
                match attempt.await {
                    Ok(ack) => break ack,
                    Err(error) => {
                        tracing::warn!(subject = message.subject(), %error, retry_in_ms = backoff.delay().as_millis() as u64, "publish failed; retrying");
                        backoff.wait().await;
                    }
                }
            };
            self.settled(message, &ack);
        }
    }

    /// Records `message` as acked at the ack's stream sequence, counting it when JetStream
    /// dropped it as a duplicate.
    fn settled(&mut self, message: Message, ack: &PublishAck) {
        if ack.duplicate {
            self.duplicates += 1;
        }
        self.acked.push(Acked {
            message,
            sequence: ack.sequence,
        });
    }
}

//! The one consumer loop every stage runs: the loop owns the consumer's lifecycle, the stage's
//! [`Handler`] owns what a message means.
//!
//! The loop pulls with a bound (`batch_size` at a time, and in the priority group with an
//! expiry well below the failover when the consumer is [pinned](mod@crate::pinned)), holds each
//! message from its arrival ([`InFlight`]: progress acks while the stage works on it), acks a
//! previous owner's copy of a transfer (its event is on the new owner's subject), dead-letters
//! what the handler cannot decode, and hands the rest over in arrival order, only while the
//! handler has room. The handler acks each message after its effect. A pull that fails or ends
//! is started again with backoff while the handler goes on with what it holds. On stop
//! nothing more is handed over: what arrived is given back at once (a nak, so another
//! instance takes it now; what was still on its way comes back after the ack wait), the
//! handler finishes what it holds, and a pinned consumer lets its pin go.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use futures::{FutureExt as _, StreamExt};
use podstream_proto::subject::{Stage, Subjects};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

use crate::dead::{self, DeadLetter};
use crate::in_flight::{Held, InFlight, Inbox};
use crate::pinned::{self, PRIORITY_GROUP};
use crate::{Backoff, Condition, Health};

/// What the handler makes of one message.
#[derive(Debug)]
pub enum Decoded<T> {
    /// An item to handle.
    Item(T),
    /// Not one: dead-lettered with this reason, then acked.
    Dead(String),
}

/// A message handed to the handler: what it decoded to, the message (ack it after the
/// effect), and its stream sequence (0 when the server did not say).
#[derive(Debug)]
pub struct Delivery<T> {
    /// What the message decoded to.
    pub item: T,
    /// The message, held until dropped.
    pub message: Held,
    /// Its sequence in the stream.
    pub sequence: u64,
}

/// The handler stopped taking messages (a lane it feeds is gone); the loop stops too.
#[derive(Debug, thiserror::Error)]
#[error("the consumer's handler stopped: {0}")]
pub struct HandlerStopped(pub String);

/// A stage's side of the loop: what a message means and what is done with it.
pub trait Handler: Send {
    /// What a message decodes to.
    type Item: Send;
    /// A piece of work that finished, for [`Handler::after`].
    type Done: Send;

    /// Decodes one message, or says why it is dead.
    fn decode(&self, message: &jetstream::Message) -> Decoded<Self::Item>;

    /// Whether it takes more now (the loop stops pulling while it has none).
    fn has_room(&self) -> bool;

    /// Takes messages that arrived, in order; acks each after its effect.
    fn take(
        &mut self,
        deliveries: Vec<Delivery<Self::Item>>,
    ) -> impl Future<Output = Result<(), HandlerStopped>> + Send;

    /// Resolves with the next piece of its work that finished, at once with `None` when it
    /// holds nothing running. Cancel-safe: the loop drops it when a message comes first, so
    /// nothing may change before its last await.
    fn finished(&mut self) -> impl Future<Output = Option<Self::Done>> + Send;

    /// What follows a finished piece (acks, counts, the next piece started); always run to
    /// its end.
    fn after(&mut self, done: Self::Done) -> impl Future<Output = ()> + Send;

    /// Finishes everything it holds: the loop is stopping.
    fn drain(&mut self) -> impl Future<Output = ()> + Send {
        async {
            while let Some(done) = self.finished().await {
                self.after(done).await;
            }
        }
    }
}

/// How the consumer is shared among instances.
#[derive(Debug, Clone)]
pub enum Sharing {
    /// Pinned to one instance at a time (the processors): pulled in the priority group, let
    /// go on stop so a standby takes over now.
    Pinned {
        /// The consumer's stream (the pin is let go through it).
        stream: Box<jetstream::stream::Stream>,
        /// How long a silent pinned instance keeps the consumer.
        failover: Duration,
    },
    /// Shared by every instance (the sinks).
    Shared,
}

/// Where the loop's dead letters go.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    /// The JetStream context they are published with.
    pub js: jetstream::Context,
    /// The subjects (and so the dead-letter subject) of the deployment.
    pub subjects: Subjects,
    /// The stage they are dead letters of.
    pub stage: Stage,
}

/// How a stage pulls, the same for each of its consumers.
#[derive(Clone)]
pub struct Pulling {
    /// Messages pulled at once, at most.
    pub batch_size: usize,
    /// Holds every message pulled until its ack.
    pub in_flight: InFlight,
    /// `ConsumerBound` follows the pull.
    pub health: Health,
}

/// One durable consumer and what its loop needs.
#[derive(Clone)]
pub struct ConsumerLoop {
    /// The consumer pulled.
    pub consumer: PullConsumer,
    /// Pinned or shared.
    pub sharing: Sharing,
    /// How it is pulled.
    pub pulling: Pulling,
    /// Where what does not decode goes.
    pub dead: DeadLetters,
}

/// What the loop itself did (the handler counts the rest).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Consumed {
    /// Messages dead-lettered because they did not decode.
    pub dead_lettered: u64,
    /// Previous owners' copies acked without handling.
    pub notices: u64,
}

/// Messages as they arrived, in chunks.
type Chunks = futures::stream::ReadyChunks<Inbox>;

impl ConsumerLoop {
    /// Runs `handler` on the consumer until `stopped` turns true (or the handler stops), then
    /// lets it finish what it holds. Fails only when the handler stopped taking messages.
    pub async fn run<H: Handler>(
        &self,
        handler: &mut H,
        mut stopped: watch::Receiver<bool>,
    ) -> Result<Consumed, HandlerStopped> {
        let name = self.consumer.cached_info().name.clone();
        let mut consumed = Consumed::default();
        let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        let mut inbox: Option<Chunks> = None;
        let mut next_pull = Instant::now();
        let mut outcome = Ok(());
        loop {
            let room = handler.has_room();
            let pulling = inbox.is_some();
            tokio::select! {
                () = stopping(&mut stopped) => break,
                Some(done) = handler.finished() => handler.after(done).await,
                _ = tokio::time::sleep_until(next_pull), if !pulling => match self.pull().await {
                    Ok(messages) => {
                        self.pulling.health.set(Condition::ConsumerBound, true);
                        inbox = Some(self.pulling.in_flight.receive(messages).ready_chunks(self.pulling.batch_size.max(1)));
                    }
                    Err(error) => {
                        self.pulling.health.set(Condition::ConsumerBound, false);
                        warn!(%error, consumer = %name, retry_in_ms = backoff.delay().as_millis() as u64, "starting the pull failed; retrying");
                        next_pull = Instant::now() + backoff.step();
                    }
                },
                chunk = next_chunk(&mut inbox), if pulling && room => match chunk {
                    Some(chunk) => {
                        let deliveries = self.sort(handler, chunk, &mut consumed).await;
                        if !deliveries.is_empty()
                            && let Err(stopped) = handler.take(deliveries).await
                        {
                            outcome = Err(stopped);
                            break;
                        }
                    }
                    None => {
                        self.pulling.health.set(Condition::ConsumerBound, false);
                        warn!(consumer = %name, retry_in_ms = backoff.delay().as_millis() as u64, "the pull stream ended; pulling again");
                        inbox = None;
                        next_pull = Instant::now() + backoff.step();
                    }
                },
            }
        }
        // What arrived but was not handed over goes back at once, for the next instance.
        if let Some(chunks) = inbox.as_mut() {
            while let Some(Some(chunk)) = chunks.next().now_or_never() {
                for message in chunk.into_iter().flatten() {
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                }
            }
        }
        drop(inbox);
        handler.drain().await;
        if let Sharing::Pinned { stream, .. } = &self.sharing {
            pinned::release(stream, &self.consumer).await;
        }
        outcome.map(|()| consumed)
    }

    /// Starts a pull: in the priority group when pinned, expiring well below the failover so
    /// a live instance keeps its pin.
    async fn pull(
        &self,
    ) -> Result<jetstream::consumer::pull::Stream, jetstream::consumer::StreamError> {
        let pull = self
            .consumer
            .stream()
            .max_messages_per_batch(self.pulling.batch_size);
        match &self.sharing {
            Sharing::Pinned { failover, .. } => {
                pull.group(PRIORITY_GROUP)
                    .expires((*failover / 4).max(Duration::from_millis(200)))
                    .messages()
                    .await
            }
            Sharing::Shared => pull.messages().await,
        }
    }

    /// Acks previous owners' copies, dead-letters what does not decode; the rest in order.
    async fn sort<H: Handler>(
        &self,
        handler: &mut H,
        chunk: Vec<<Inbox as futures::Stream>::Item>,
        consumed: &mut Consumed,
    ) -> Vec<Delivery<H::Item>> {
        let mut deliveries = Vec::with_capacity(chunk.len());
        for message in chunk {
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    warn!(%error, "receiving a message failed");
                    continue;
                }
            };
            if crate::role::is_left_notice(message.headers.as_ref()) {
                consumed.notices += 1;
                ack(&message).await;
                continue;
            }
            let sequence = message.info().map(|i| i.stream_sequence).unwrap_or(0);
            match handler.decode(&message) {
                Decoded::Item(item) => deliveries.push(Delivery {
                    item,
                    message,
                    sequence,
                }),
                Decoded::Dead(reason) => {
                    dead_letter(&self.dead, &message, sequence, reason).await;
                    consumed.dead_lettered += 1;
                }
            }
        }
        deliveries
    }
}

/// Stores `message` (stream sequence `sequence`) as a dead letter of `to.stage` for
/// `reason`, then acks it.
pub async fn dead_letter(
    to: &DeadLetters,
    message: &jetstream::Message,
    sequence: u64,
    reason: String,
) {
    warn!(subject = %message.subject, sequence, stage = to.stage.token(), %reason, "dead-lettered");
    let letter = DeadLetter::of_message(&to.subjects, to.stage, message, reason);
    dead::store(&to.js, &letter).await;
    ack(message).await;
}

/// Acks `message`; a failed ack only means it comes back, and is found already done.
pub async fn ack(message: &jetstream::Message) {
    if let Err(error) = message.ack_with(AckKind::Ack).await {
        warn!(%error, subject = %message.subject, "ack failed; the message will be redelivered and found done");
    }
}

/// Resolves once `stopped` turns true (or its sender is gone).
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// The next chunk of `inbox`; never resolves when there is none.
async fn next_chunk(inbox: &mut Option<Chunks>) -> Option<<Chunks as futures::Stream>::Item> {
    match inbox.as_mut() {
        Some(chunks) => chunks.next().await,
        None => std::future::pending().await,
    }
}

//! Messages a stage has pulled and not yet acked, kept from redelivery while it works on them.
//!
//! Every durable consumer has a short ack wait ([`DEFAULT_ACK_WAIT_SECONDS`]), so what a
//! crashed instance held comes back within seconds, not after half a minute. A live instance
//! must then say that it is still at work on whatever it holds longer than that (a batch
//! waiting on a slow database, a record write retried while KV is away): [`InFlight`] holds
//! each message from the moment it arrives until it is acked or dropped, and sends a progress
//! ack (`+WPI`, which restarts the server's ack timer) for every message held a third of the
//! ack wait. A message decided in milliseconds costs an insert and a remove in a map.
//!
//! [`DEFAULT_ACK_WAIT_SECONDS`]: crate::config::DEFAULT_ACK_WAIT_SECONDS

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull::MessagesError};
use async_nats::{Client, Subject};
use bytes::Bytes;
use dashmap::DashMap;
use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The body of a progress ack: "work in progress", the ack timer starts again.
const PROGRESS: &[u8] = b"+WPI";

/// The messages one stage holds, kept alive with progress acks; cheap to clone.
#[derive(Clone)]
pub struct InFlight {
    shared: Arc<Shared>,
}

struct Shared {
    held: DashMap<u64, Entry>,
    next: AtomicU64,
}

/// One held message: where its acks go, and since when the server has heard nothing of it.
struct Entry {
    reply: Subject,
    since: Instant,
}

impl InFlight {
    /// Starts keeping the messages held through it alive on `client`, for consumers whose ack
    /// wait is `ack_wait`. The keeper stops with the last clone.
    pub fn start(client: Client, ack_wait: Duration) -> InFlight {
        let shared = Arc::new(Shared {
            held: DashMap::new(),
            next: AtomicU64::new(0),
        });
        let every = (ack_wait / 3).max(Duration::from_millis(100));
        tokio::spawn(keep(Arc::downgrade(&shared), client, every));
        InFlight { shared }
    }

    /// Holds `message` until the returned [`Held`] is dropped (after its ack, or never acked).
    pub fn hold(&self, message: jetstream::Message) -> Held {
        let id = self.shared.next.fetch_add(1, Ordering::Relaxed);
        if let Some(reply) = &message.reply {
            self.shared.held.insert(
                id,
                Entry {
                    reply: reply.clone(),
                    since: Instant::now(),
                },
            );
        }
        Held {
            message,
            id,
            shared: Arc::clone(&self.shared),
        }
    }

    /// A consumer's messages as they arrive, each held at once: a task reads the pull ahead of
    /// the stage, so nothing waits unheld in the client's buffer while the stage is busy
    /// (the consumer's `max_ack_pending` bounds what it holds). Pulling stops with the inbox.
    pub fn receive<S>(&self, mut messages: S) -> Inbox
    where
        S: Stream<Item = Result<jetstream::Message, MessagesError>> + Send + Unpin + 'static,
    {
        let (sender, receiver) = mpsc::unbounded();
        let in_flight = self.clone();
        let pull = tokio::spawn(async move {
            while let Some(next) = messages.next().await {
                if sender
                    .unbounded_send(next.map(|message| in_flight.hold(message)))
                    .is_err()
                {
                    return;
                }
            }
        });
        Inbox { receiver, pull }
    }

    /// How many messages are held now.
    pub fn len(&self) -> usize {
        self.shared.held.len()
    }

    /// Whether no message is held.
    pub fn is_empty(&self) -> bool {
        self.shared.held.is_empty()
    }
}

/// Every `every`, a progress ack for each message held at least that long.
async fn keep(shared: Weak<Shared>, client: Client, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut due = Vec::new();
        for mut entry in shared.held.iter_mut() {
            if now.duration_since(entry.since) >= every {
                entry.since = now;
                due.push(entry.reply.clone());
            }
        }
        drop(shared);
        for reply in due {
            if let Err(error) = client.publish(reply, Bytes::from_static(PROGRESS)).await {
                tracing::debug!(%error, "progress ack failed; the message may be redelivered");
            }
        }
    }
}

/// A message held by its stage: it reads as the message (`Deref`), and dropping it ends the
/// progress acks, so ack first, then drop.
pub struct Held {
    message: jetstream::Message,
    id: u64,
    shared: Arc<Shared>,
}

impl std::ops::Deref for Held {
    type Target = jetstream::Message;

    fn deref(&self) -> &jetstream::Message {
        &self.message
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.held.remove(&self.id);
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("subject", &self.message.subject)
            .finish_non_exhaustive()
    }
}

/// A consumer's messages, held from the moment they arrived; ends when the pull ends.
pub struct Inbox {
    receiver: mpsc::UnboundedReceiver<Result<Held, MessagesError>>,
    pull: JoinHandle<()>,
}

impl Stream for Inbox {
    type Item = Result<Held, MessagesError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_next_unpin(cx)
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.pull.abort();
    }
}

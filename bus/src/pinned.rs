//! One instance per consumer. Every processor pulls its consumers in one priority group and
//! the server pins one instance at a time; the others stand by and take over when the pinned
//! one stops pulling (the priority timeout, `--failover-seconds`) or lets go. The pod
//! consumers and the Spark consumer are bound and released the same way.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use tracing::{debug, info};

/// The priority group every processor pulls in.
pub const PRIORITY_GROUP: &str = "podstream";

/// A pinned consumer's settings.
pub struct Pinned<'a> {
    /// The durable consumer's name.
    pub name: &'a str,
    /// The subjects it reads.
    pub filter: String,
    /// How long it waits for an ack before delivering again: how soon a crashed instance's
    /// events are decided again.
    pub ack_wait: Duration,
    /// How long a silent pinned instance keeps it.
    pub failover: Duration,
    /// Unacked messages at most (0: the server's default).
    pub max_ack_pending: i64,
}

/// The server refused to create or update a pinned consumer.
#[derive(Debug, thiserror::Error)]
#[error("creating consumer {name}")]
pub struct BindError {
    /// The consumer's name.
    pub name: String,
    /// The server's answer.
    #[source]
    pub source: jetstream::stream::ConsumerError,
}

/// The durable consumer `pinned` of `stream`, created or updated (so a changed ack wait or
/// failover reaches an existing one), with its pin taken and what it held made deliverable
/// again now.
pub async fn bind(
    stream: &jetstream::stream::Stream,
    pinned: Pinned<'_>,
) -> Result<jetstream::consumer::PullConsumer, BindError> {
    let name = pinned.name;
    let wanted = pull::Config {
        durable_name: Some(name.to_owned()),
        filter_subject: pinned.filter.clone(),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: pinned.ack_wait,
        max_ack_pending: pinned.max_ack_pending,
        priority_policy: jetstream::consumer::PriorityPolicy::PinnedClient,
        priority_groups: vec![PRIORITY_GROUP.to_owned()],
        priority_timeout: pinned.failover,
        ..Default::default()
    };
    let consumer =
        crate::streams::while_unavailable(name, || stream.create_consumer(wanted.clone()))
            .await
            .map_err(|source| BindError {
                name: name.to_owned(),
                source,
            })?;
    // A start is most often a restart after a crash, whose pin would keep the consumer for
    // --failover-seconds: take it now. A live pinned instance hands over once, which per-pod
    // order allows (see the service's module doc).
    if let Err(error) = stream.unpin_consumer(name, PRIORITY_GROUP).await {
        debug!(%error, consumer = %name, "unpin on start failed; waiting for the pin to time out");
    }
    // And back to its ack floor: what a dead instance held is delivered again now, not after
    // the ack wait. What a live one holds too is decided twice at worst, which the records
    // make a no-op. Servers before NATS 2.14 refuse; the ack wait then applies.
    if let Err(error) = stream.reset_consumer(name, None).await {
        debug!(%error, consumer = %name, "consumer reset on start refused; in-flight events come back after the ack wait");
    }
    info!(consumer = %name, filter = %pinned.filter, "processing");
    Ok(consumer)
}

/// Hands the pin of `consumer` to a standby instance now rather than after the priority
/// timeout.
pub async fn release(
    stream: &jetstream::stream::Stream,
    consumer: &jetstream::consumer::PullConsumer,
) {
    let name = &consumer.cached_info().name;
    if let Err(error) = stream.unpin_consumer(name, PRIORITY_GROUP).await {
        debug!(%error, consumer = %name, "unpin on shutdown failed; the pin times out");
    }
}

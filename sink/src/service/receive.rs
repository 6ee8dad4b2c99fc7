//! Commands as they arrive: a continuous pull whose messages are held from arrival (progress
//! acks until their batch commits), each decoded and handed to its TI's lane, or dead-lettered.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use podstream_bus::in_flight::{Held, InFlight, Inbox};
use podstream_bus::{Backoff, Condition, Health};
use podstream_proto::Command;
use podstream_proto::subject::Subjects;
use prost::Message as _;

use super::report::{ack, dead_letter};
use crate::item::Item;
use crate::lanes::Lanes;
use crate::summary::Summary;

/// Messages in chunks of what has arrived.
pub(super) type Chunks = futures::stream::ReadyChunks<Inbox>;

/// The consumer's messages in chunks of what has arrived, each held from its arrival,
/// retrying until the pull starts.
pub(super) async fn pull_stream(
    consumer: &jetstream::consumer::PullConsumer,
    batch_size: usize,
    in_flight: &InFlight,
    health: &Health,
) -> Chunks {
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
    loop {
        match consumer
            .stream()
            .max_messages_per_batch(batch_size)
            .messages()
            .await
        {
            Ok(messages) => {
                health.set(Condition::ConsumerBound, true);
                return in_flight.receive(messages).ready_chunks(batch_size.max(1));
            }
            Err(error) => {
                health.set(Condition::ConsumerBound, false);
                tracing::warn!(%error, "pulling commands failed; retrying");
                backoff.wait().await;
            }
        }
    }
}

/// Hands each command of `chunk` to its lane; a previous owner's copy is acked (applied from
/// the other), what is not a `Command` dead-lettered. Fails only when the lanes have stopped.
pub(super) async fn hand_over(
    chunk: Vec<<Inbox as futures::Stream>::Item>,
    lanes: &Lanes<Held>,
    js: &jetstream::Context,
    subjects: &Subjects,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    for message in chunk {
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(%error, "receiving a command failed");
                continue;
            }
        };
        if podstream_bus::role::is_left_notice(message.headers.as_ref()) {
            // The previous owner's copy of a transfer: applied from the other.
            ack(&message).await;
            continue;
        }
        let sequence = message.info().map(|i| i.stream_sequence).ok();
        match Command::decode(message.payload.as_ref()) {
            Ok(command) => lanes
                .send(Item { command, sequence }, message)
                .await
                .context("handing a command to the database")?,
            Err(error) => {
                let reason = format!("not a Command: {error}");
                dead_letter(js, subjects, &message, &reason).await;
                summary.dead_lettered += 1;
                ack(&message).await;
            }
        }
    }
    Ok(())
}

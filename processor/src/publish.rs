//! Commands onto JetStream, the same for the pod and the Spark consumers: on the owner's
//! subject with their deterministic `Nats-Msg-Id`, a transfer also on its previous owner's.

use async_nats::jetstream;
use bytes::Bytes;
use podstream_proto::subject::{Role, Subjects};
use podstream_proto::v1::Command;
use podstream_proto::v1::command::Kind;
use prost::Message as _;
use tracing::info;

/// Publishes commands in order on their owners' subjects (a transfer also on its previous
/// owner's, marked `left`) and waits for every ack.
pub async fn publish(
    js: &jetstream::Context,
    subjects: &Subjects,
    commands: &[Command],
) -> Result<(), jetstream::context::PublishError> {
    let mut acks = Vec::with_capacity(commands.len());
    for command in commands {
        let uid = command.pod.as_ref().map_or("", |p| p.uid.as_str());
        let payload = Bytes::from(command.encode_to_vec());
        // A transfer is also the previous owner's news (its executor frees the slot):
        // a copy on its subject, marked `left`, which the sink does not apply again.
        if let Some(Kind::Transfer(transfer)) = &command.kind
            && transfer.from != command.owner
        {
            // Headers first: `headers` replaces the map `message_id` writes into.
            let notice = jetstream::message::PublishMessage::build()
                .headers(podstream_bus::role::headers(Role::Left))
                .message_id(podstream_proto::msg_id::left_copy(&command.id))
                .payload(payload.clone());
            let subject = subjects.commands(&transfer.from, uid);
            acks.push(js.send_publish(subject, notice).await?);
        }
        let subject = subjects.commands(&command.owner, uid);
        let message = jetstream::message::PublishMessage::build()
            .headers(podstream_bus::role::headers(Role::Event))
            .message_id(&command.id)
            .payload(payload);
        let ack = js.send_publish(subject, message).await?;
        let kind = command.kind.as_ref().map_or("none", |k| k.name());
        metrics::counter!(podstream_bus::metrics::PROCESSOR_COMMANDS, "kind" => kind).increment(1);
        // Fields are evaluated only when the event is enabled: no TI string at warn level.
        info!(
            pod = %uid,
            ti = %command.task.as_ref().map(ToString::to_string).unwrap_or_default(),
            owner = %command.owner,
            kind = command.kind.as_ref().map_or("none", |k| k.name()),
            id = %command.id,
            "command"
        );
        acks.push(ack);
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

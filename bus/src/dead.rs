//! Dead letters: what a stage could not use, kept with the reason, so nothing is lost.

use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use podstream_proto::msg_id;
use podstream_proto::subject::{Stage, Subjects};

pub use podstream_proto::subject::{ORIGINAL_SIZE_HEADER, REASON_HEADER, SOURCE_HEADER};

/// Room kept under the server's `max_payload` for the headers and the protocol.
pub const HEADROOM: usize = 16 * 1024;

/// The largest message body podstream writes on a server that takes `max_payload` bytes
/// (`ServerInfo::max_payload`): [`HEADROOM`] is kept for headers and the protocol.
pub fn body_limit(max_payload: usize) -> usize {
    max_payload.saturating_sub(HEADROOM)
}
/// Longest header value kept (a reason quoting a huge value is cut too).
const MAX_HEADER_VALUE: usize = 4 * 1024;

/// A dead letter ready to publish: the original bytes plus reason headers.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// `podstream.dead.<stage>`.
    pub subject: String,
    /// A deterministic `Nats-Msg-Id`, so a retried dead letter is stored once.
    pub msg_id: String,
    /// Why.
    pub reason: String,
    /// Where it came from (a subject, or a pod reference).
    pub source: String,
    /// The original bytes, untouched.
    pub payload: Bytes,
}

impl DeadLetter {
    /// The dead letter of a message `stage`'s consumer could not use, for `reason`: its bytes
    /// untouched, its subject as the source, and an id of its stage, subject and stream
    /// sequence ([`msg_id::dead_message`]).
    pub fn of_message(
        subjects: &Subjects,
        stage: Stage,
        message: &async_nats::jetstream::Message,
        reason: String,
    ) -> DeadLetter {
        let sequence = message
            .info()
            .map(|info| info.stream_sequence)
            .unwrap_or_default();
        DeadLetter {
            subject: subjects.dead_letters(stage),
            msg_id: msg_id::dead_message(stage, &message.subject, sequence),
            reason,
            source: message.subject.to_string(),
            payload: message.payload.clone(),
        }
    }

    /// The dead letter of an object the ingest could not use: `source` names it, `msg_id`
    /// is one of [`msg_id`]'s, `payload` is what is kept of it.
    pub fn of_object(
        subjects: &Subjects,
        msg_id: String,
        source: String,
        reason: String,
        payload: Bytes,
    ) -> DeadLetter {
        DeadLetter {
            subject: subjects.dead_letters(Stage::Ingest),
            msg_id,
            reason,
            source,
            payload,
        }
    }

    /// The message to publish on a server that takes messages of up to `max_payload` bytes
    /// (`ServerInfo::max_payload`). A payload that does not fit is cut to fit, with its
    /// original size in [`ORIGINAL_SIZE_HEADER`]: a dead letter that can never be stored
    /// would stall its stage.
    pub fn to_publish(&self, max_payload: usize) -> PublishMessage {
        let mut headers = HeaderMap::new();
        headers.insert(REASON_HEADER, header_value(&self.reason).as_str());
        headers.insert(SOURCE_HEADER, header_value(&self.source).as_str());
        let room = body_limit(max_payload).max(1024);
        let payload = if self.payload.len() > room {
            headers.insert(
                ORIGINAL_SIZE_HEADER,
                self.payload.len().to_string().as_str(),
            );
            self.payload.slice(..room)
        } else {
            self.payload.clone()
        };
        PublishMessage::build()
            .headers(headers)
            .payload(payload)
            .message_id(&self.msg_id)
    }
}

/// A header value: one line, at most [`MAX_HEADER_VALUE`] bytes (cut on a char boundary).
fn header_value(text: &str) -> String {
    let mut line = text.replace(['\r', '\n'], " ");
    if line.len() > MAX_HEADER_VALUE {
        let mut end = MAX_HEADER_VALUE;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    line
}

/// Stores `dead` on its subject, retrying with backoff until JetStream acks it: a dead
/// letter is the only copy of what could not be handled, so it is never given up. It always
/// fits ([`DeadLetter::to_publish`]), so what is retried is NATS being away, during which
/// the stage can ack nothing either; a stop is bounded by `--shutdown-timeout-seconds`.
pub async fn store(js: &async_nats::jetstream::Context, dead: &DeadLetter) {
    let mut backoff = crate::Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
    );
    loop {
        let sent = async {
            let ack = js
                .send_publish(
                    dead.subject.clone(),
                    dead.to_publish(js.client().server_info().max_payload),
                )
                .await?;
            ack.await
                .map(|_| ())
                .map_err(Into::<Box<dyn std::error::Error + Send + Sync>>::into)
        };
        match sent.await {
            Ok(()) => {
                let stage = dead
                    .subject
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                metrics::counter!(crate::metrics::DEAD_LETTERS, "stage" => stage).increment(1);
                return;
            }
            Err(error) => {
                tracing::warn!(%error, subject = %dead.subject, "dead letter not stored; retrying");
                backoff.wait().await;
            }
        }
    }
}

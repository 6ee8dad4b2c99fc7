//! Dead letters: what a stage could not use, kept with the reason, so nothing is lost.

use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;

pub use podstream_proto::subject::{REASON_HEADER, SOURCE_HEADER};

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
    /// The message to publish.
    pub fn to_publish(&self) -> PublishMessage {
        let mut headers = HeaderMap::new();
        // Header values must be one line.
        headers.insert(REASON_HEADER, one_line(&self.reason).as_str());
        headers.insert(SOURCE_HEADER, one_line(&self.source).as_str());
        PublishMessage::build()
            .headers(headers)
            .payload(self.payload.clone())
            .message_id(&self.msg_id)
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

/// Stores `dead` on its subject, retrying with backoff until JetStream acks it: a dead
/// letter is the only copy of what could not be handled, so it is never given up.
pub async fn store(js: &async_nats::jetstream::Context, dead: &DeadLetter) {
    let mut backoff = crate::Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
    );
    loop {
        let sent = async {
            let ack = js
                .send_publish(dead.subject.clone(), dead.to_publish())
                .await?;
            ack.await
                .map(|_| ())
                .map_err(Into::<Box<dyn std::error::Error + Send + Sync>>::into)
        };
        match sent.await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(%error, subject = %dead.subject, "dead letter not stored; retrying");
                backoff.wait().await;
            }
        }
    }
}

//! A stream's stored messages read in order by batched direct gets (`$JS.API.DIRECT.GET`),
//! with no consumer: a user allowed only direct gets on a stream can read all of it, and
//! cannot create, redefine or pull anyone's consumer (deploy/nats/podstream-users.conf).
//!
//! The streams podstream creates allow direct gets; a batch is one request answered by up to
//! [`BATCH`] messages and an end-of-batch status (nats-server 2.11 and later).

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use async_nats::{Client, StatusCode, Subscriber};
use futures::StreamExt;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Messages asked for in one direct get.
pub const BATCH: usize = 256;

/// The status that ends a batch (204, "EOB").
const END_OF_BATCH: u16 = 204;

/// How long the server may take to start answering a batch.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Where reading starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The first message at or after this stream sequence.
    Sequence(u64),
    /// The first message stored at or after this time.
    Time(OffsetDateTime),
}

/// Why a stream's history could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Subscribing to the reply inbox or sending the request failed.
    #[error("asking {stream} for messages: {source}")]
    Request {
        /// The stream.
        stream: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// No answer in time: the server does not allow direct gets on the stream (it predates
    /// podstream's settings, or is not podstream's), or the user may not ask.
    #[error(
        "{stream} did not answer a direct get within {ANSWER_TIMEOUT:?}: the stream must allow direct gets (podstream's components set allow_direct when they start) and the user needs $JS.API.DIRECT.GET.{stream}"
    )]
    NoAnswer {
        /// The stream.
        stream: String,
    },
    /// The server answered with an error status.
    #[error("{stream} refused a direct get: {status} {description}")]
    Refused {
        /// The stream.
        stream: String,
        /// The status code.
        status: StatusCode,
        /// The server's words.
        description: String,
    },
    /// A message came without the headers a direct get adds.
    #[error("a message of {stream} came without its stream headers: {source}")]
    Malformed {
        /// The stream.
        stream: String,
        /// What was missing.
        #[source]
        source: async_nats::jetstream::message::StreamMessageError,
    },
}

/// One stream's messages from a start up to a last sequence, in order.
pub struct History {
    client: Client,
    stream: String,
    request_subject: String,
    inbox: String,
    replies: Option<Subscriber>,
    next: Option<Start>,
    last: u64,
    buffer: VecDeque<StreamMessage>,
}

impl History {
    /// `stream`'s messages from `start` up to sequence `last` (the stream's last sequence when
    /// reading starts, for a bounded read), through `client`'s JetStream API prefix `$JS.API`.
    pub fn new(client: &Client, stream: &str, start: Start, last: u64) -> History {
        History {
            client: client.clone(),
            stream: stream.to_owned(),
            request_subject: format!("$JS.API.DIRECT.GET.{stream}"),
            inbox: client.new_inbox(),
            replies: None,
            next: Some(start),
            last,
            buffer: VecDeque::new(),
        }
    }

    /// The next message, or `None` past `last` or at the stream's end.
    pub async fn next(&mut self) -> Result<Option<StreamMessage>, HistoryError> {
        while self.buffer.is_empty() && self.next.is_some() {
            self.fill().await?;
        }
        Ok(self.buffer.pop_front())
    }

    /// Asks for the next batch and keeps what is at or before `last`.
    async fn fill(&mut self) -> Result<(), HistoryError> {
        let Some(start) = self.next.take() else {
            return Ok(());
        };
        if matches!(start, Start::Sequence(sequence) if sequence > self.last) {
            return Ok(());
        }
        let request = request_body(start);
        let stream = self.stream.clone();
        let request_error = |source| HistoryError::Request {
            stream: stream.clone(),
            source,
        };
        if self.replies.is_none() {
            let replies = self
                .client
                .subscribe(self.inbox.clone())
                .await
                .map_err(|e| request_error(e.into()))?;
            self.replies = Some(replies);
        }
        self.client
            .publish_with_reply(
                self.request_subject.clone(),
                self.inbox.clone(),
                request.into(),
            )
            .await
            .map_err(|e| request_error(e.into()))?;
        let Some(replies) = self.replies.as_mut() else {
            return Ok(());
        };
        let mut last_seen = None;
        loop {
            let reply = tokio::time::timeout(ANSWER_TIMEOUT, replies.next()).await;
            let Ok(Some(reply)) = reply else {
                return Err(HistoryError::NoAnswer {
                    stream: self.stream.clone(),
                });
            };
            match reply.status {
                // End of batch: what is left is in its header.
                Some(status) if status.as_u16() == END_OF_BATCH => {
                    let more = pending(&reply) != Some(0);
                    if more && let Some(seen) = last_seen.filter(|seen| *seen < self.last) {
                        self.next = Some(Start::Sequence(seen + 1));
                    }
                    return Ok(());
                }
                // Nothing at or after the start.
                Some(StatusCode::NOT_FOUND) => return Ok(()),
                Some(status) if status != StatusCode::OK => {
                    return Err(HistoryError::Refused {
                        stream: self.stream.clone(),
                        status,
                        description: reply.description.unwrap_or_default(),
                    });
                }
                _ => {}
            }
            let message =
                StreamMessage::try_from(reply).map_err(|source| HistoryError::Malformed {
                    stream: self.stream.clone(),
                    source,
                })?;
            last_seen = Some(message.sequence);
            if message.sequence <= self.last {
                self.buffer.push_back(message);
            }
        }
    }
}

/// `Nats-Num-Pending` of an end-of-batch status: the messages after the batch.
fn pending(reply: &async_nats::Message) -> Option<u64> {
    reply
        .headers
        .as_ref()?
        .get("Nats-Num-Pending")?
        .as_str()
        .parse()
        .ok()
}

/// The JSON of one batched direct get from `start`.
fn request_body(start: Start) -> String {
    match start {
        Start::Sequence(sequence) => format!(r#"{{"seq":{sequence},"batch":{BATCH}}}"#),
        Start::Time(time) => {
            // A time that cannot be printed in RFC 3339 is outside any stream: start at 1.
            match time.format(&Rfc3339) {
                Ok(time) => format!(r#"{{"start_time":"{time}","batch":{BATCH}}}"#),
                Err(_) => format!(r#"{{"seq":1,"batch":{BATCH}}}"#),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_starts_at_a_sequence_or_a_time() {
        assert_eq!(
            request_body(Start::Sequence(7)),
            format!(r#"{{"seq":7,"batch":{BATCH}}}"#)
        );
        let time = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        assert_eq!(
            request_body(Start::Time(time)),
            format!(r#"{{"start_time":"2023-11-14T22:13:20Z","batch":{BATCH}}}"#)
        );
    }
}

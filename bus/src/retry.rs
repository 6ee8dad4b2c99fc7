//! What a stage does after a failed attempt at an effect, from the failure's type: try again
//! at once (a compare-and-set lost a race), wait and try again (the server is away or slow:
//! for as long as it takes, with the delays bounded by the backoff's maximum), or give up and
//! dead-letter the message (retrying would fail the same way for ever and hold its lane).
//!
//! Waits are not counted against a number of tries: a NATS outage is waited out, never turned
//! into dead letters. What is dead at once is decided by the failure's type.

use std::time::Duration;

use crate::Backoff;

/// What a failed attempt calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Try again at once: what was read changed meanwhile.
    Again,
    /// Wait with backoff, then try again: the server may get over it.
    Wait,
    /// Give up: it would fail the same way every time.
    Dead,
}

/// A failure that says what it calls for.
pub trait Classify: std::error::Error {
    /// What this failure calls for.
    fn verdict(&self) -> Verdict;
}

/// What to do after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try the effect again (after the wait, when it called for one).
    TryAgain,
    /// Give up and dead-letter.
    GiveUp,
}

/// One effect's retries: its backoff between waits.
#[derive(Debug)]
pub struct Retrying {
    backoff: Backoff,
}

impl Retrying {
    /// Waits start at `initial` and double up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Retrying {
        Retrying {
            backoff: Backoff::new(initial, max),
        }
    }

    /// The wait the next [`Verdict::Wait`] will take, for the caller's log line.
    pub fn delay(&self) -> Duration {
        self.backoff.delay()
    }

    /// Acts on `failure`: returns at once to try again or give up, or after the wait.
    pub async fn after<E: Classify + ?Sized>(&mut self, failure: &E) -> Next {
        match failure.verdict() {
            Verdict::Again => Next::TryAgain,
            Verdict::Wait => {
                self.backoff.wait().await;
                Next::TryAgain
            }
            Verdict::Dead => Next::GiveUp,
        }
    }
}

/// `error` with each of its causes, `: `-separated, as a log line or a dead letter's reason.
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        text.push_str(": ");
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}

/// The verdict on a JetStream publish that failed: a message over the server's limit is dead,
/// anything else (no ack in time, a broken connection, a stream away) is waited out.
pub fn publish_verdict(error: &async_nats::jetstream::context::PublishError) -> Verdict {
    use async_nats::jetstream::context::PublishErrorKind;
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => Verdict::Dead,
        _ => Verdict::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::{Classify, Next, Retrying, Verdict};
    use std::time::Duration;

    #[derive(Debug, thiserror::Error)]
    #[error("{0:?}")]
    struct Failure(Verdict);

    impl Classify for Failure {
        fn verdict(&self) -> Verdict {
            self.0
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("writing the record")]
    struct Outer(#[source] Failure);

    #[test]
    fn a_reason_names_every_cause() {
        let error = Outer(Failure(Verdict::Wait));
        assert_eq!(super::with_causes(&error), "writing the record: Wait");
    }

    /// Each verdict, and how long it holds the caller.
    #[tokio::test(start_paused = true)]
    async fn each_verdict_acts_as_it_says() {
        let table = [
            (Verdict::Again, Next::TryAgain, Duration::ZERO),
            (Verdict::Wait, Next::TryAgain, Duration::from_millis(100)),
            (Verdict::Dead, Next::GiveUp, Duration::ZERO),
        ];
        for (verdict, next, at_least) in table {
            let mut retrying =
                Retrying::new(Duration::from_millis(100), Duration::from_millis(100));
            let start = tokio::time::Instant::now();
            assert_eq!(retrying.after(&Failure(verdict)).await, next, "{verdict:?}");
            let waited = start.elapsed();
            assert!(
                waited >= at_least && waited < at_least * 2 + Duration::from_millis(1),
                "{verdict:?} waited {waited:?}"
            );
        }
    }
}

//! Exponential backoff between retries: every component's "wait, then try again".
//!
//! The delays come from `backon` with jitter: many instances that lost the same server at the
//! same moment (every sink when the database fails over) do not come back in lockstep.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays that double from `initial` up to `max`, each stretched by a random part of itself
/// (so a delay lies between its base and twice that).
#[derive(Debug)]
pub struct Backoff {
    delays: ExponentialBackoff,
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `initial`; a base delay never exceeds `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let mut delays = ExponentialBuilder::new()
            .with_min_delay(initial)
            .with_max_delay(max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        let next = delays.next().unwrap_or(max);
        Backoff { delays, next, max }
    }

    /// The delay the next `wait` will sleep.
    pub fn delay(&self) -> Duration {
        self.next
    }

    /// Sleeps for the current delay, then moves to the next one.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.step()).await;
    }

    /// The current delay, moving to the next one: for a caller that waits in its own way.
    pub fn step(&mut self) -> Duration {
        let now = self.next;
        self.next = self.delays.next().unwrap_or(self.max);
        now
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn doubles_up_to_the_maximum_with_jitter() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let mut seen = Vec::new();
        for _ in 0..40 {
            seen.push(backoff.delay().as_millis());
            backoff.wait().await;
        }
        for (delay, base) in seen.iter().zip([100, 200, 350, 350]) {
            assert!(
                (base..2 * base).contains(delay),
                "{delay} ms for a base of {base}"
            );
        }
        assert!(seen[3..].iter().all(|d| (350..700).contains(d)));
        let distinct: std::collections::HashSet<_> = seen[3..].iter().collect();
        assert!(distinct.len() > 5, "jittered: {seen:?}");
    }
}

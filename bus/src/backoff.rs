//! Exponential backoff between retries: every component's "wait, then try again".

use std::time::Duration;

/// Delays that double from `initial` up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    delay: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `initial`, never waits longer than `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            delay: initial,
            max,
        }
    }

    /// The delay the next `wait` will sleep.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// Sleeps for the current delay, then doubles it (up to the maximum).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn doubles_up_to_the_maximum() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(backoff.delay().as_millis());
            backoff.wait().await;
        }
        assert_eq!(seen, [100, 200, 350, 350]);
    }
}

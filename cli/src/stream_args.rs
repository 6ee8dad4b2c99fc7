//! Flags every component that talks to JetStream shares: the subject prefix and the
//! settings of the streams it makes sure of.

use std::time::Duration;

use clap::Args;
use podstream_bus::StreamSettings;

/// Subject prefix and stream settings.
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    /// Subject prefix; streams are named after it (PODSTREAM_PODS, PODSTREAM_COMMANDS, PODSTREAM_DEAD).
    #[arg(long, env = "PODSTREAM_PREFIX", default_value = "podstream")]
    pub prefix: String,
    /// Stream and bucket replicas (3 on a JetStream cluster).
    #[arg(long, env = "PODSTREAM_STREAM_REPLICAS", default_value_t = 1)]
    pub stream_replicas: usize,
    /// Seconds in which a re-published message is dropped as a duplicate.
    #[arg(
        long,
        env = "PODSTREAM_DUPLICATE_WINDOW_SECONDS",
        default_value_t = 120
    )]
    pub duplicate_window_seconds: u64,
    /// Hours messages are kept for replay.
    #[arg(long, env = "PODSTREAM_MAX_AGE_HOURS", default_value_t = 168)]
    pub max_age_hours: u64,
}

impl StreamArgs {
    /// The stream settings these flags describe.
    pub fn settings(&self) -> StreamSettings {
        StreamSettings {
            replicas: self.stream_replicas,
            duplicate_window: Duration::from_secs(self.duplicate_window_seconds),
            max_age: Duration::from_secs(self.max_age_hours * 3600),
            ..StreamSettings::default()
        }
    }
}

//! Where podstream's streams are and how they are kept: the one bus configuration every
//! component that talks to JetStream shares, with its defaults.

use std::time::Duration;

use podstream_proto::subject::{DEFAULT_PREFIX, Subjects, TokenError};

/// The NATS server a component connects to unless told otherwise.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
/// Seconds in which a re-published message is dropped as a duplicate, by default.
pub const DEFAULT_DUPLICATE_WINDOW_SECONDS: u64 = 120;
/// The dead-letter stream's byte limit when none is given (oldest dropped first): a stream of
/// pods that stay unusable must not fill the server's disk.
pub const DEFAULT_DEAD_LETTER_MAX_BYTES: u64 = 1 << 30;
/// Seconds a durable consumer waits for an ack before it redelivers, by default: what a
/// crashed instance held comes back this soon; a live one keeps what it works on longer with
/// progress acks ([`crate::in_flight`]).
pub const DEFAULT_ACK_WAIT_SECONDS: u64 = 4;
/// Seconds a silent pinned instance keeps its consumer before a standby takes over, by
/// default: the processor's and the collector's.
pub const DEFAULT_FAILOVER_SECONDS: u64 = 5;
/// Hours messages are kept for replay, by default.
pub const DEFAULT_MAX_AGE_HOURS: u64 = 7 * 24;

/// The NATS server, the subject prefix, and the settings of the streams and buckets.
#[derive(Clone, PartialEq)]
pub struct BusConfig {
    /// NATS server URL (several, comma-separated, for a cluster).
    pub nats_url: String,
    /// Credentials and TLS for the connection.
    pub security: crate::NatsSecurity,
    /// Subject prefix; the streams are named after it.
    pub prefix: String,
    /// Settings of the streams and buckets a component makes sure of.
    pub streams: StreamSettings,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            nats_url: DEFAULT_NATS_URL.to_owned(),
            security: crate::NatsSecurity::default(),
            prefix: DEFAULT_PREFIX.to_owned(),
            streams: StreamSettings::default(),
        }
    }
}

impl std::fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusConfig")
            .field("nats_url", &crate::connect::redacted(&self.nats_url))
            .field("security", &self.security)
            .field("prefix", &self.prefix)
            .field("streams", &self.streams)
            .finish()
    }
}

impl BusConfig {
    /// The default prefix and stream settings on the NATS server at `nats_url`.
    pub fn at(nats_url: &str) -> BusConfig {
        BusConfig {
            nats_url: nats_url.to_owned(),
            ..BusConfig::default()
        }
    }

    /// The subjects under this prefix, or why the prefix is not one.
    pub fn subjects(&self) -> Result<Subjects, TokenError> {
        Subjects::new(&self.prefix)
    }
}

/// The default duplicate window.
pub fn default_duplicate_window() -> Duration {
    Duration::from_secs(DEFAULT_DUPLICATE_WINDOW_SECONDS)
}

/// The default replay horizon.
pub fn default_max_age() -> Duration {
    Duration::from_secs(DEFAULT_MAX_AGE_HOURS * 3600)
}

/// The default ack wait of the durable consumers.
pub fn default_ack_wait() -> Duration {
    Duration::from_secs(DEFAULT_ACK_WAIT_SECONDS)
}

/// Settings every podstream stream shares. A setting left `None` is not this component's to
/// change: a stream that exists keeps its own, one this component creates gets the default.
/// A setting given (a flag) is applied to an existing stream too, with a log line, so
/// components started with different flags never undo each other's choices silently.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamSettings {
    /// Replicas (1 for a single server, 3 for a cluster); default 1.
    pub replicas: Option<usize>,
    /// Window in which a re-published `Nats-Msg-Id` is dropped as a duplicate; default
    /// [`DEFAULT_DUPLICATE_WINDOW_SECONDS`].
    pub duplicate_window: Option<Duration>,
    /// How long messages are kept (the replay horizon; zero: forever); default
    /// [`DEFAULT_MAX_AGE_HOURS`].
    pub max_age: Option<Duration>,
    /// Bytes a stream keeps at most, its oldest messages going first (0: no limit); default
    /// no limit. A cap reached while a stage lags drops what it has not read yet.
    pub max_bytes: Option<u64>,
}

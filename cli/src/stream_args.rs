//! Flags every component that talks to JetStream shares: the NATS server, the subject
//! prefix, and the settings of the streams it makes sure of. Their defaults are the bus's.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use podstream_bus::config::{DEFAULT_ACK_WAIT_SECONDS, DEFAULT_NATS_URL};
use podstream_bus::{BusConfig, StreamSettings};
use podstream_proto::subject::{DEFAULT_PREFIX, Subjects};

/// The NATS server to connect to.
#[derive(Debug, Clone, Args)]
pub struct NatsArgs {
    /// NATS server with JetStream.
    #[arg(long, env = "PODSTREAM_NATS", default_value = DEFAULT_NATS_URL)]
    pub nats: String,
}

/// The subject prefix.
#[derive(Debug, Clone, Args)]
pub struct PrefixArgs {
    /// Subject prefix; streams are named after it (PODSTREAM_PODS, PODSTREAM_COMMANDS, PODSTREAM_DEAD).
    #[arg(long, env = "PODSTREAM_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
}

impl PrefixArgs {
    /// The subjects under the prefix, or why it is not one.
    pub fn subjects(&self) -> anyhow::Result<Subjects> {
        Subjects::new(&self.prefix).context("invalid --prefix")
    }
}

/// Subject prefix and stream settings. A setting not given leaves an existing stream as it
/// is (a new stream gets the default); one given is applied to it, and logged.
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    #[command(flatten)]
    pub prefix: PrefixArgs,
    /// Stream and bucket replicas (3 on a JetStream cluster) [default for a new stream: 1].
    #[arg(long, env = "PODSTREAM_STREAM_REPLICAS")]
    pub stream_replicas: Option<usize>,
    /// Seconds in which a re-published message is dropped as a duplicate [default for a new
    /// stream: 120].
    #[arg(long, env = "PODSTREAM_DUPLICATE_WINDOW_SECONDS")]
    pub duplicate_window_seconds: Option<u64>,
    /// Hours messages are kept for replay; 0 keeps them forever [default for a new stream:
    /// 168].
    #[arg(long, env = "PODSTREAM_MAX_AGE_HOURS")]
    pub max_age_hours: Option<u64>,
}

impl StreamArgs {
    /// The stream settings these flags describe.
    pub fn settings(&self) -> StreamSettings {
        StreamSettings {
            replicas: self.stream_replicas,
            duplicate_window: self.duplicate_window_seconds.map(Duration::from_secs),
            max_age: self
                .max_age_hours
                .map(|hours| Duration::from_secs(hours.saturating_mul(3600))),
        }
    }

    /// The bus configuration of these flags on the NATS server at `nats_url`.
    pub fn bus(&self, nats_url: &str) -> BusConfig {
        BusConfig {
            nats_url: nats_url.to_owned(),
            prefix: self.prefix.prefix.clone(),
            streams: self.settings(),
        }
    }
}

/// How long a durable consumer (the processor's, the sink's) waits for an ack.
#[derive(Debug, Clone, Args)]
pub struct AckWaitArgs {
    /// Seconds a durable consumer waits for a message's ack before redelivering it: how soon
    /// the work a crashed instance held is taken up again. An instance at work on a message
    /// longer than this keeps it with progress acks, so a slow database causes no redelivery.
    #[arg(long, env = "PODSTREAM_ACK_WAIT_SECONDS", default_value_t = DEFAULT_ACK_WAIT_SECONDS)]
    pub ack_wait_seconds: u64,
}

impl AckWaitArgs {
    /// The ack wait (at least a second: a shorter one would redeliver live work).
    pub fn ack_wait(&self) -> Duration {
        Duration::from_secs(self.ack_wait_seconds.max(1))
    }
}

//! A component's start on the bus, the same for each: its subjects from the prefix, a
//! connection under its own client name, then the streams it uses made ready (created or
//! updated idempotently; a conflicting stream is refused, never overwritten).

use async_nats::jetstream::{self, stream};
use podstream_proto::subject::{Stream, Subjects, TokenError};

use crate::config::BusConfig;
use crate::connect::{ConnectError, connect};
use crate::streams::{self, StreamError};

/// Why a component could not start on the bus.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The subject prefix is not a valid NATS token.
    #[error("invalid --prefix")]
    Prefix(#[source] TokenError),
    /// No connection (refused credentials, no server, one too old).
    #[error("connecting to NATS")]
    Connect(#[source] ConnectError),
    /// A stream could not be made ready.
    #[error("making the streams ready")]
    Stream(#[source] StreamError),
}

/// Why a stage that pulls pinned consumers and keeps KV buckets (the processor, the collector)
/// did not start.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Connecting to NATS or making the streams ready failed.
    #[error("starting on the bus")]
    Bus(#[from] StartError),
    /// A KV bucket could not be opened or created.
    #[error("opening KV bucket {bucket}")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// Why.
        #[source]
        source: StreamError,
    },
    /// A stream made ready could not be opened.
    #[error("opening the {stream} stream")]
    Stream {
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: jetstream::context::GetStreamError,
    },
    /// A pinned consumer could not be created or updated.
    #[error(transparent)]
    Bind(#[from] crate::pinned::BindError),
}

/// A component on the bus: JetStream, its subjects, and the streams it asked for as the
/// server holds them, in the order asked.
pub struct OnTheBus {
    /// JetStream over the component's connection.
    pub js: jetstream::Context,
    /// The subjects under the configured prefix.
    pub subjects: Subjects,
    /// Each stream asked for, as the server holds it (its limits may be an operator's).
    pub streams: Vec<stream::Config>,
}

/// Connects as `client` and makes `wanted` ready, in that order.
pub async fn start(
    config: &BusConfig,
    client: &str,
    wanted: &[Stream],
) -> Result<OnTheBus, StartError> {
    let subjects = config.subjects().map_err(StartError::Prefix)?;
    let nats = connect(&config.nats_url, &config.security, client)
        .await
        .map_err(StartError::Connect)?;
    let js = jetstream::new(nats);
    let mut ready = Vec::with_capacity(wanted.len());
    for &stream in wanted {
        let config = streams::stream_config(&subjects, stream, &config.streams);
        ready.push(
            streams::ensure(&js, config)
                .await
                .map_err(StartError::Stream)?,
        );
    }
    Ok(OnTheBus {
        js,
        subjects,
        streams: ready,
    })
}

//! The streams podstream writes, and creating or updating them idempotently at start.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use podstream_proto::subject::{Stream, Subjects};

/// Settings every podstream stream shares. A setting left `None` is not this component's to
/// change: a stream that exists keeps its own, one this component creates gets the default.
/// A setting given (a flag) is applied to an existing stream too, with a log line, so
/// components started with different flags never undo each other's choices silently.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamSettings {
    /// Replicas (1 for a single server, 3 for a cluster); default 1.
    pub replicas: Option<usize>,
    /// Window in which a re-published `Nats-Msg-Id` is dropped as a duplicate; default
    /// [`DEFAULT_DUPLICATE_WINDOW_SECONDS`](crate::config::DEFAULT_DUPLICATE_WINDOW_SECONDS).
    pub duplicate_window: Option<Duration>,
    /// How long messages are kept (the replay horizon; zero: forever); default
    /// [`DEFAULT_MAX_AGE_HOURS`](crate::config::DEFAULT_MAX_AGE_HOURS).
    pub max_age: Option<Duration>,
}

/// A stream as podstream wants it: the configuration it is created with, and which of its
/// settings an existing stream is brought to.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// The configuration of a new stream.
    pub config: stream::Config,
    given: StreamSettings,
}

/// Why a stream could not be made ready.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A stream exists with settings podstream cannot change into its own.
    #[error(
        "stream {stream} exists with {what}; refusing to change it (delete it or use another --prefix)"
    )]
    Conflict {
        /// The stream's name.
        stream: String,
        /// What differs.
        what: String,
    },
    /// The JetStream API refused or failed.
    #[error("stream {stream}: {source}")]
    Api {
        /// The stream's name.
        stream: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The stream `stream` under `subjects`' prefix, with `settings`.
pub fn stream_config(subjects: &Subjects, stream: Stream, settings: &StreamSettings) -> Wanted {
    let description = match stream {
        Stream::PodEvents => "Airflow worker-pod events (podstream ingest)",
        Stream::Commands => "Task-state commands (podstream processor)",
        Stream::DeadLetters => "Items a podstream stage could not use, with the reason",
    };
    Wanted {
        config: stream::Config {
            name: subjects.stream_name(stream),
            subjects: vec![subjects.stream_subjects(stream)],
            description: Some(description.to_owned()),
            storage: stream::StorageType::File,
            num_replicas: settings.replicas.unwrap_or(1),
            duplicate_window: settings
                .duplicate_window
                .unwrap_or_else(crate::config::default_duplicate_window),
            max_age: settings
                .max_age
                .unwrap_or_else(crate::config::default_max_age),
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        },
        given: settings.clone(),
    }
}

/// Creates the stream, or brings an existing one to the settings given; returns its
/// configuration as the server now has it. Subjects, storage and retention are never changed
/// on an existing stream: a difference there is a `Conflict`.
pub async fn ensure(
    js: &jetstream::Context,
    wanted: Wanted,
) -> Result<stream::Config, StreamError> {
    let Wanted {
        config: wanted,
        given,
    } = wanted;
    let name = wanted.name.clone();
    let api = |source: Box<dyn std::error::Error + Send + Sync>| StreamError::Api {
        stream: name.clone(),
        source,
    };
    match js.get_stream(&wanted.name).await {
        Ok(mut existing) => {
            let info = existing.info().await.map_err(|e| api(Box::new(e)))?;
            let current = &info.config;
            let mut conflicts = Vec::new();
            if current.subjects != wanted.subjects {
                conflicts.push(format!(
                    "subjects {:?} (podstream needs {:?})",
                    current.subjects, wanted.subjects
                ));
            }
            if current.storage != wanted.storage {
                conflicts.push(format!(
                    "storage {:?} (podstream needs {:?})",
                    current.storage, wanted.storage
                ));
            }
            if current.retention != wanted.retention {
                conflicts.push(format!(
                    "retention {:?} (podstream needs {:?})",
                    current.retention, wanted.retention
                ));
            }
            if !conflicts.is_empty() {
                return Err(StreamError::Conflict {
                    stream: name.clone(),
                    what: conflicts.join(", "),
                });
            }
            let mut updated = current.clone();
            let mut changes = Vec::new();
            if let Some(max_age) = given.max_age
                && max_age != current.max_age
            {
                changes.push(format!("max_age {:?} -> {max_age:?}", current.max_age));
                updated.max_age = max_age;
            }
            if let Some(window) = given.duplicate_window
                && window != current.duplicate_window
            {
                changes.push(format!(
                    "duplicate_window {:?} -> {window:?}",
                    current.duplicate_window
                ));
                updated.duplicate_window = window;
            }
            if let Some(replicas) = given.replicas
                && replicas != current.num_replicas
            {
                changes.push(format!("replicas {} -> {replicas}", current.num_replicas));
                updated.num_replicas = replicas;
            }
            if changes.is_empty() {
                return Ok(current.clone());
            }
            let info = js
                .update_stream(updated)
                .await
                .map_err(|e| api(Box::new(e)))?;
            tracing::warn!(stream = %name, changes = %changes.join(", "), "stream settings changed as given");
            Ok(info.config.clone())
        }
        Err(error)
            if matches!(
                error.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(inner)
                    if inner.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            match js.create_stream(wanted.clone()).await {
                Ok(_) => {
                    tracing::info!(stream = %name, "stream created");
                    Ok(wanted)
                }
                Err(error) if error.to_string().contains("overlap") => Err(StreamError::Conflict {
                    stream: name.clone(),
                    what: format!("subjects claimed by another stream ({error})"),
                }),
                Err(error) => Err(api(Box::new(error))),
            }
        }
        Err(error) => Err(api(Box::new(error))),
    }
}

/// Opens KV bucket `wanted.bucket`, creating it with `wanted` when it does not exist (an
/// existing bucket is used as it is). File storage and history 1 unless `wanted` says otherwise.
pub async fn bucket(
    js: &jetstream::Context,
    wanted: jetstream::kv::Config,
) -> Result<jetstream::kv::Store, StreamError> {
    if let Ok(store) = js.get_key_value(&wanted.bucket).await {
        return Ok(store);
    }
    let name = wanted.bucket.clone();
    js.create_key_value(wanted)
        .await
        .map_err(|source| StreamError::Api {
            stream: format!("KV_{name}"),
            source: Box::new(source),
        })
}

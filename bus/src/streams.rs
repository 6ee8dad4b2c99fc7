//! The streams podstream writes, and creating or updating them idempotently at start.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use podstream_proto::subject::{Stream, Subjects};

/// Settings every podstream stream shares; the defaults suit one NATS server.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSettings {
    /// Replicas (1 for a single server, 3 for a cluster).
    pub replicas: usize,
    /// Window in which a re-published `Nats-Msg-Id` is dropped as a duplicate.
    pub duplicate_window: Duration,
    /// How long messages are kept (the replay horizon).
    pub max_age: Duration,
    /// File storage (durable) or memory.
    pub storage: stream::StorageType,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            replicas: 1,
            duplicate_window: crate::config::default_duplicate_window(),
            max_age: crate::config::default_max_age(),
            storage: stream::StorageType::File,
        }
    }
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

/// The configuration of `stream` under `subjects`' prefix, with `settings`.
pub fn stream_config(
    subjects: &Subjects,
    stream: Stream,
    settings: &StreamSettings,
) -> stream::Config {
    let description = match stream {
        Stream::PodEvents => "Airflow worker-pod events (podstream ingest)",
        Stream::Commands => "Task-state commands (podstream processor)",
        Stream::DeadLetters => "Items a podstream stage could not use, with the reason",
    };
    config(
        subjects.stream_name(stream),
        subjects.stream_subjects(stream),
        description,
        settings,
    )
}

fn config(
    name: String,
    subject: String,
    description: &str,
    settings: &StreamSettings,
) -> stream::Config {
    stream::Config {
        name,
        subjects: vec![subject],
        description: Some(description.to_owned()),
        storage: settings.storage,
        num_replicas: settings.replicas,
        duplicate_window: settings.duplicate_window,
        max_age: settings.max_age,
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        ..Default::default()
    }
}

/// Creates the stream, or brings an existing one to these settings. Subjects, storage and
/// retention are never changed on an existing stream: a difference there is a `Conflict`.
pub async fn ensure(js: &jetstream::Context, wanted: stream::Config) -> Result<(), StreamError> {
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
            let differs = current.max_age != wanted.max_age
                || current.duplicate_window != wanted.duplicate_window
                || current.num_replicas != wanted.num_replicas;
            if differs {
                let mut updated = current.clone();
                updated.max_age = wanted.max_age;
                updated.duplicate_window = wanted.duplicate_window;
                updated.num_replicas = wanted.num_replicas;
                js.update_stream(updated)
                    .await
                    .map_err(|e| api(Box::new(e)))?;
                tracing::info!(stream = %name, "stream settings updated");
            }
            Ok(())
        }
        Err(error)
            if matches!(
                error.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(inner)
                    if inner.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            match js.create_stream(wanted).await {
                Ok(_) => {
                    tracing::info!(stream = %name, "stream created");
                    Ok(())
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

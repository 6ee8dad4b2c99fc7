//! The streams podstream writes, and creating or updating them idempotently at start.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use podstream_proto::subject::{Stream, Subjects};

pub use crate::config::StreamSettings;

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
    /// Creating the stream failed while another component was creating it, and it is not
    /// there yet: not now rather than no (nats-server refuses a second concurrent create with
    /// "error creating store for stream").
    #[error("stream {stream}: being created by another component ({source})")]
    CreateRaced {
        /// The stream's name.
        stream: String,
        /// The create's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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
        Stream::Spark => {
            "Spark driver pods and SparkApplications of Airflow's Spark jobs (podstream ingest --spark)"
        }
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
            max_bytes: bytes_limit(settings.max_bytes.unwrap_or(match stream {
                Stream::DeadLetters => crate::config::DEFAULT_DEAD_LETTER_MAX_BYTES,
                _ => 0,
            })),
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            // Read-only users (replay, other subscribers) read by direct gets, with no consumer.
            allow_direct: true,
            ..Default::default()
        },
        given: settings.clone(),
    }
}

/// JetStream's form of a byte limit: -1 for none.
fn bytes_limit(bytes: u64) -> i64 {
    match bytes {
        0 => -1,
        bytes => i64::try_from(bytes).unwrap_or(i64::MAX),
    }
}

/// Says so when `config` keeps its messages forever: neither an age nor a size bounds it.
fn warn_if_unbounded(config: &stream::Config) {
    if config.max_age.is_zero() && config.max_bytes <= 0 {
        tracing::warn!(stream = %config.name, "the stream keeps its messages forever (max age 0, no max bytes): its storage grows without bound");
    }
}

/// Creates the stream, or brings an existing one to the settings given; returns its
/// configuration as the server now has it. Subjects, storage and retention are never changed
/// on an existing stream: a difference there is a `Conflict`. While JetStream is unavailable
/// (no answer, no leader yet) it retries with backoff, logging each attempt; a component's
/// shutdown timeout bounds the wait.
pub async fn ensure(
    js: &jetstream::Context,
    wanted: Wanted,
) -> Result<stream::Config, StreamError> {
    let name = wanted.config.name.clone();
    let config = while_unavailable(&name, || ensure_once(js, wanted.clone())).await?;
    warn_if_unbounded(&config);
    Ok(config)
}

/// Runs `op` until it succeeds or fails for a reason other than JetStream being unavailable
/// ([`is_unavailable`]), waiting with backoff between attempts and logging each; what a
/// component sets up at start (consumers) goes through it, so a cluster still electing its
/// leaders delays the start instead of ending it.
pub async fn while_unavailable<T, E, F, Fut>(what: &str, mut op: F) -> Result<T, E>
where
    E: std::error::Error + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut backoff = crate::Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
    loop {
        match op().await {
            Err(error) if is_unavailable(&error) => {
                tracing::warn!(what, %error, retry_in_ms = backoff.delay().as_millis() as u64, "JetStream unavailable; retrying");
                backoff.wait().await;
            }
            done => return done,
        }
    }
}

/// Whether an error, or any error it was caused by, means "not now" rather than "no": no
/// answer in time, nobody to answer, a cluster without its leader.
pub fn is_unavailable(error: &(dyn std::error::Error + 'static)) -> bool {
    use jetstream::context::{
        CreateStreamErrorKind, GetStreamErrorKind, RequestError, RequestErrorKind,
    };
    let mut cause = Some(error);
    while let Some(error) = cause {
        let unavailable = if let Some(e) = error.downcast_ref::<RequestError>() {
            matches!(
                e.kind(),
                RequestErrorKind::NoResponders | RequestErrorKind::TimedOut
            )
        } else if let Some(e) = error.downcast_ref::<jetstream::context::GetStreamError>() {
            match e.kind() {
                GetStreamErrorKind::Request => true,
                GetStreamErrorKind::JetStream(inner) => {
                    inner.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE
                }
                _ => false,
            }
        } else if let Some(e) = error.downcast_ref::<jetstream::context::CreateStreamError>() {
            match e.kind() {
                CreateStreamErrorKind::JetStreamUnavailable | CreateStreamErrorKind::TimedOut => {
                    true
                }
                CreateStreamErrorKind::JetStream(inner) => {
                    inner.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE
                }
                _ => false,
            }
        } else if let Some(e) = error.downcast_ref::<jetstream::stream::ConsumerError>() {
            use jetstream::stream::ConsumerErrorKind;
            match e.kind() {
                ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
                ConsumerErrorKind::JetStream(inner) => {
                    inner.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE
                }
                _ => false,
            }
        } else if let Some(e) = error.downcast_ref::<jetstream::context::CreateKeyValueError>() {
            e.kind() == jetstream::context::CreateKeyValueErrorKind::TimedOut
        } else if let Some(e) = error.downcast_ref::<jetstream::Error>() {
            e.error_code() == jetstream::ErrorCode::CLUSTER_NOT_AVAILABLE
        } else if let Some(e) = error.downcast_ref::<StreamError>() {
            matches!(e, StreamError::CreateRaced { .. })
        } else {
            false
        };
        if unavailable {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The error as [`StreamError::Api`] of `stream`; [`is_unavailable`] still sees through it.
fn api<E: std::error::Error + Send + Sync + 'static>(stream: &str, error: E) -> StreamError {
    StreamError::Api {
        stream: stream.to_owned(),
        source: Box::new(error),
    }
}

async fn ensure_once(
    js: &jetstream::Context,
    wanted: Wanted,
) -> Result<stream::Config, StreamError> {
    let Wanted {
        config: wanted,
        given,
    } = wanted;
    let name = wanted.name.clone();
    match js.get_stream(&wanted.name).await {
        Ok(existing) => reconcile(js, existing, &wanted, &given).await,
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
                // Components start together: another one may have created the stream since
                // it was looked up, and the server then refuses this create; while that
                // other create is still making the store, the stream is not there yet.
                Err(error) => match js.get_stream(&name).await {
                    Ok(existing) => reconcile(js, existing, &wanted, &given).await,
                    Err(_) if is_stream_create_error(&error) => Err(StreamError::CreateRaced {
                        stream: name.clone(),
                        source: Box::new(error),
                    }),
                    Err(_) => Err(api(&name, error)),
                },
            }
        }
        Err(error) => Err(api(&name, error)),
    }
}

/// Whether a create failed with nats-server's "error creating store for stream" (10049), as
/// a second create of one stream does while the first is making its store.
fn is_stream_create_error(error: &jetstream::context::CreateStreamError) -> bool {
    matches!(
        error.kind(),
        jetstream::context::CreateStreamErrorKind::JetStream(inner)
            if inner.error_code() == jetstream::ErrorCode::STREAM_CREATE
    )
}

/// Checks an existing stream against `wanted` and applies the settings `given`.
async fn reconcile(
    js: &jetstream::Context,
    mut existing: jetstream::stream::Stream,
    wanted: &stream::Config,
    given: &StreamSettings,
) -> Result<stream::Config, StreamError> {
    let name = wanted.name.clone();
    let info = existing.info().await.map_err(|e| api(&name, e))?;
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
    if let Some(bytes) = given.max_bytes.map(bytes_limit)
        && bytes != current.max_bytes
    {
        changes.push(format!("max_bytes {} -> {bytes}", current.max_bytes));
        updated.max_bytes = bytes;
    }
    if let Some(replicas) = given.replicas
        && replicas != current.num_replicas
    {
        changes.push(format!("replicas {} -> {replicas}", current.num_replicas));
        updated.num_replicas = replicas;
    }
    if wanted.allow_direct && !current.allow_direct {
        changes.push("allow_direct false -> true".to_owned());
        updated.allow_direct = true;
    }
    if changes.is_empty() {
        return Ok(current.clone());
    }
    let info = js.update_stream(updated).await.map_err(|e| api(&name, e))?;
    tracing::warn!(stream = %name, changes = %changes.join(", "), "stream settings changed as given");
    Ok(info.config.clone())
}

/// The stream JetStream keeps KV bucket `bucket` in.
pub fn bucket_stream(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// The KV bucket of task records by default: the processor writes it, the collector reads it.
pub const DEFAULT_RECORDS_BUCKET: &str = "podstream-process";
/// The role in the name of a prefix's bucket of task records (`<prefix>-process`, see
/// [`podstream_proto::subject::Subjects::resource_name`]).
pub const RECORDS_BUCKET_ROLE: &str = "process";

/// The KV bucket of task records `name`, opened (made when missing) as long-lived and as
/// replicated as the pod-events stream `pods`: for the processor, and for the collector that
/// reads it.
pub async fn records_bucket(
    js: &jetstream::Context,
    name: &str,
    pods: &stream::Config,
) -> Result<jetstream::kv::Store, StreamError> {
    let description = "podstream processor: per task instance, its pods' states";
    bucket_beside(js, name, description, pods).await
}

/// Opens KV bucket `name` (see [`bucket`]) for records kept as long and as replicated as the
/// stream `beside` that they follow, one value per key, on file storage.
pub async fn bucket_beside(
    js: &jetstream::Context,
    name: &str,
    description: &str,
    beside: &stream::Config,
) -> Result<jetstream::kv::Store, StreamError> {
    let wanted = jetstream::kv::Config {
        bucket: name.to_owned(),
        description: description.to_owned(),
        history: 1,
        // Records of what has had no event for this long go; no older event can come again.
        max_age: beside.max_age,
        storage: stream::StorageType::File,
        num_replicas: beside.num_replicas,
        ..Default::default()
    };
    bucket(js, wanted).await
}

/// Opens KV bucket `wanted.bucket`, creating it with `wanted` when it does not exist (an
/// existing bucket is used as it is). File storage and history 1 unless `wanted` says otherwise.
pub async fn bucket(
    js: &jetstream::Context,
    wanted: jetstream::kv::Config,
) -> Result<jetstream::kv::Store, StreamError> {
    let stream = bucket_stream(&wanted.bucket);
    while_unavailable(&stream, || async {
        if let Ok(store) = js.get_key_value(&wanted.bucket).await {
            return Ok(store);
        }
        match js.create_key_value(wanted.clone()).await {
            Ok(store) => Ok(store),
            // As for a stream: another component may have created it since it was looked up.
            Err(error) => js.get_key_value(&wanted.bucket).await.map_err(|_| error),
        }
    })
    .await
    .map_err(|error| api(&stream, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::{
        CreateKeyValueError, CreateKeyValueErrorKind, CreateStreamError, CreateStreamErrorKind,
        RequestError, RequestErrorKind,
    };

    #[test]
    fn only_the_dead_letters_have_a_byte_limit_unless_one_is_given() {
        let subjects = Subjects::default();
        let limit = |stream, max_bytes| {
            let settings = StreamSettings {
                max_bytes,
                ..StreamSettings::default()
            };
            stream_config(&subjects, stream, &settings).config.max_bytes
        };
        let default = i64::try_from(crate::config::DEFAULT_DEAD_LETTER_MAX_BYTES).unwrap();
        assert_eq!(limit(Stream::DeadLetters, None), default);
        assert_eq!(limit(Stream::DeadLetters, Some(4096)), 4096);
        assert_eq!(limit(Stream::PodEvents, None), -1);
        assert_eq!(limit(Stream::Commands, Some(4096)), 4096);
        let dead = stream_config(&subjects, Stream::DeadLetters, &StreamSettings::default());
        assert_eq!(dead.config.discard, stream::DiscardPolicy::Old);
    }

    #[test]
    fn no_answer_is_unavailable_and_a_refusal_is_not() {
        let cases: [(Box<dyn std::error::Error + Send + Sync>, bool); 7] = [
            (
                Box::new(RequestError::new(RequestErrorKind::TimedOut)),
                true,
            ),
            (
                Box::new(RequestError::new(RequestErrorKind::NoResponders)),
                true,
            ),
            (
                Box::new(CreateStreamError::new(CreateStreamErrorKind::TimedOut)),
                true,
            ),
            (
                Box::new(CreateStreamError::new(
                    CreateStreamErrorKind::InvalidStreamName,
                )),
                false,
            ),
            (
                Box::new(CreateKeyValueError::new(CreateKeyValueErrorKind::TimedOut)),
                true,
            ),
            (
                Box::new(api(
                    "KV_x",
                    CreateKeyValueError::new(CreateKeyValueErrorKind::InvalidStoreName),
                )),
                false,
            ),
            // Through the error podstream wraps it in.
            (
                Box::new(api(
                    "PODSTREAM_PODS",
                    RequestError::new(RequestErrorKind::NoResponders),
                )),
                true,
            ),
        ];
        for (error, unavailable) in cases {
            assert_eq!(is_unavailable(error.as_ref()), unavailable, "{error}");
        }
    }
}

//! NATS as a component uses it: a login with its credentials under its client name (its
//! replies come to its own inbox), then each stream and bucket it uses, looked up with the
//! same API calls its start makes: there or not yet, and on as many servers as a cluster
//! needs.

use std::time::Duration;

use async_nats::jetstream;
use podstream_bus::config::BusConfig;
use podstream_bus::connect::{NatsCredentials, connect, redacted};
use podstream_bus::fault::{Classified, Fault};
use podstream_bus::streams::bucket_stream;
use podstream_proto::subject::Stream;

use super::Report;

/// How long a login may take before the servers count as unreachable.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Logs in as `client` and looks up `streams` and `buckets`.
pub(super) async fn check(
    report: &mut Report,
    config: &BusConfig,
    client: &str,
    streams: &[Stream],
    buckets: &[&str],
) {
    let shown = redacted(&config.nats_url);
    let subjects = match config.subjects() {
        Ok(subjects) => subjects,
        Err(error) => {
            report.fail(
                "nats",
                Fault::Configuration,
                format!("invalid --prefix: {error}"),
            );
            return;
        }
    };
    let nats = match tokio::time::timeout(
        LOGIN_TIMEOUT,
        connect(&config.nats_url, &config.security, client),
    )
    .await
    {
        Ok(Ok(nats)) => nats,
        Ok(Err(error)) => {
            report.fail(
                "nats login",
                error.fault(),
                format!("{}", anyhow::Error::new(error).context(shown)),
            );
            return;
        }
        Err(_) => {
            report.fail(
                "nats login",
                Fault::Unavailable,
                format!(
                    "no server of {shown} answered within {} s",
                    LOGIN_TIMEOUT.as_secs()
                ),
            );
            return;
        }
    };
    let info = nats.server_info();
    report.pass(
        "nats login",
        format!(
            "{shown} as {}, nats-server {}{}",
            who(&config.security.credentials),
            info.version,
            info.cluster
                .as_deref()
                .map(|cluster| format!(" in cluster {cluster}"))
                .unwrap_or_default()
        ),
    );
    let clustered = info.cluster.is_some();
    let js = jetstream::new(nats);
    let names = streams
        .iter()
        .map(|&stream| subjects.stream_name(stream))
        .chain(buckets.iter().map(|bucket| bucket_stream(bucket)));
    for name in names {
        look_up(report, &js, &name, config.streams.replicas, clustered).await;
    }
}

/// One stream: there with enough replicas, or not there yet (the component's start creates it
/// with `replicas`, or 1).
async fn look_up(
    report: &mut Report,
    js: &jetstream::Context,
    name: &str,
    replicas: Option<usize>,
    clustered: bool,
) {
    let item = format!("stream {name}");
    let (held, found) = match js.get_stream(name).await {
        Ok(mut stream) => match stream.info().await {
            Ok(info) => (
                info.config.num_replicas,
                format!(
                    "{} replica(s), {} messages",
                    info.config.num_replicas, info.state.messages
                ),
            ),
            Err(error) => {
                report.fail(&item, Fault::Unavailable, error.to_string());
                return;
            }
        },
        Err(error) if not_found(&error) => {
            let created = replicas.unwrap_or(1);
            (
                created,
                format!(
                    "not there yet: the component's start creates it with {created} replica(s)"
                ),
            )
        }
        Err(error) => {
            report.fail(
                &item,
                Fault::Configuration,
                format!(
                    "{error}: the user may not look it up (it needs $JS.API.STREAM.INFO.{name}; \
                     deploy/nats/podstream-users.conf)"
                ),
            );
            return;
        }
    };
    // A stream the start brings to --stream-replicas counts as having them.
    let effective = replicas.unwrap_or(held);
    if clustered && effective < 3 {
        report.fail(
            &item,
            Fault::Configuration,
            format!(
                "{found}; on a JetStream cluster one lost server then loses what it holds: set \
                 PODSTREAM_STREAM_REPLICAS=3 (--stream-replicas), which the start applies"
            ),
        );
    } else {
        report.pass(&item, found);
    }
}

/// Whom the component logs in as: the user, or the method.
fn who(credentials: &NatsCredentials) -> String {
    match credentials {
        NatsCredentials::UserPassword { user, .. } => format!("user {user}"),
        other => other.method().to_owned(),
    }
}

/// Whether JetStream answered that the stream does not exist.
fn not_found(error: &jetstream::context::GetStreamError) -> bool {
    matches!(
        error.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(api)
            if api.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

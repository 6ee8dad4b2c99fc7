//! Flags every component that talks to JetStream shares: the NATS server and how to log in
//! to it, the subject prefix, and the settings of the streams it makes sure of. Their
//! defaults are the bus's.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use podstream_bus::config::{DEFAULT_ACK_WAIT_SECONDS, DEFAULT_NATS_URL};
use podstream_bus::{BusConfig, NatsCredentials, NatsSecurity, NatsTls, StreamSettings};
use podstream_proto::subject::{DEFAULT_PREFIX, Subjects};

/// The NATS server to connect to, and how.
#[derive(Debug, Clone, Args)]
pub struct NatsArgs {
    /// NATS server with JetStream (several, comma-separated, for a cluster; tls:// requires
    /// TLS); the bus's default when not given.
    #[arg(long, env = "PODSTREAM_NATS", hide_env_values = true, help = nats_help())]
    pub nats: Option<String>,
    #[command(flatten)]
    pub security: NatsSecurityArgs,
}

/// `--nats`'s help, its default read from the bus (`run` says its own).
fn nats_help() -> String {
    format!(
        "NATS server with JetStream (several, comma-separated, for a cluster; tls:// requires \
         TLS) [default: {DEFAULT_NATS_URL}]"
    )
}

impl NatsArgs {
    /// The server(s) to connect to: `--nats`, else the bus's default. (`run` reads `nats`
    /// itself: without it, it starts a local server.)
    pub fn url(&self) -> &str {
        self.nats.as_deref().unwrap_or(DEFAULT_NATS_URL)
    }
}

/// Credentials and TLS for NATS. Secrets are read from files; only their paths are flags.
#[derive(Debug, Clone, Default, Args)]
#[group(id = "nats-credentials", multiple = false)]
pub struct NatsCredentialArgs {
    /// NATS credentials file (a user JWT and its nkey seed).
    #[arg(long, env = "PODSTREAM_NATS_CREDS", value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// File holding an nkey seed.
    #[arg(long, env = "PODSTREAM_NATS_NKEY", value_name = "FILE")]
    pub nats_nkey: Option<PathBuf>,
    /// NATS user name; the password comes from --nats-password-file.
    #[arg(long, env = "PODSTREAM_NATS_USER", requires = "nats_password_file")]
    pub nats_user: Option<String>,
    /// File holding a NATS token.
    #[arg(long, env = "PODSTREAM_NATS_TOKEN_FILE", value_name = "FILE")]
    pub nats_token_file: Option<PathBuf>,
}

/// The NATS connection's credentials and TLS flags.
#[derive(Debug, Clone, Default, Args)]
pub struct NatsSecurityArgs {
    #[command(flatten)]
    pub credentials: NatsCredentialArgs,
    /// File holding the password of --nats-user.
    #[arg(
        long,
        env = "PODSTREAM_NATS_PASSWORD_FILE",
        value_name = "FILE",
        requires = "nats_user"
    )]
    pub nats_password_file: Option<PathBuf>,
    /// PEM file of the CA certificates that sign the NATS servers' certificates.
    #[arg(long, env = "PODSTREAM_NATS_CA", value_name = "FILE")]
    pub nats_ca: Option<PathBuf>,
    /// PEM client certificate, for mutual TLS (with --nats-key).
    #[arg(
        long,
        env = "PODSTREAM_NATS_CERT",
        value_name = "FILE",
        requires = "nats_key"
    )]
    pub nats_cert: Option<PathBuf>,
    /// PEM key of --nats-cert.
    #[arg(
        long,
        env = "PODSTREAM_NATS_KEY",
        value_name = "FILE",
        requires = "nats_cert"
    )]
    pub nats_key: Option<PathBuf>,
    /// Require TLS even for nats:// URLs.
    #[arg(long, env = "PODSTREAM_NATS_TLS")]
    pub nats_tls: bool,
}

impl NatsSecurityArgs {
    /// The security these flags describe.
    pub fn security(&self) -> NatsSecurity {
        let given = &self.credentials;
        let credentials = if let Some(path) = &given.nats_creds {
            NatsCredentials::CredsFile(path.clone())
        } else if let Some(path) = &given.nats_nkey {
            NatsCredentials::NkeySeedFile(path.clone())
        } else if let (Some(user), Some(password_file)) =
            (&given.nats_user, &self.nats_password_file)
        {
            NatsCredentials::UserPassword {
                user: user.clone(),
                password_file: password_file.clone(),
            }
        } else if let Some(path) = &given.nats_token_file {
            NatsCredentials::TokenFile(path.clone())
        } else {
            NatsCredentials::Anonymous
        };
        NatsSecurity {
            credentials,
            tls: NatsTls {
                ca: self.nats_ca.clone(),
                client: self.nats_cert.clone().zip(self.nats_key.clone()),
                required: self.nats_tls,
            },
        }
    }
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
    /// Hours messages are kept for replay (fractions allowed: 0.5 is half an hour); 0 keeps
    /// them forever [default for a new stream: 168].
    #[arg(long, env = "PODSTREAM_MAX_AGE_HOURS", value_parser = parse_hours)]
    pub max_age_hours: Option<Duration>,
    /// Bytes each stream keeps at most, its oldest messages going first; 0 for no limit
    /// [default for a new stream: no limit]. A stage that lags past it loses what it had not
    /// read: size it well above a day of events.
    #[arg(long, env = "PODSTREAM_STREAM_MAX_BYTES")]
    pub stream_max_bytes: Option<u64>,
}

impl StreamArgs {
    /// The stream settings these flags describe.
    pub fn settings(&self) -> StreamSettings {
        StreamSettings {
            replicas: self.stream_replicas,
            duplicate_window: self.duplicate_window_seconds.map(Duration::from_secs),
            max_age: self.max_age_hours,
            max_bytes: self.stream_max_bytes,
        }
    }

    /// The bus configuration of these flags on the NATS server at `nats_url`.
    pub fn bus(&self, nats_url: &str, security: NatsSecurity) -> BusConfig {
        BusConfig {
            nats_url: nats_url.to_owned(),
            security,
            prefix: self.prefix.prefix.clone(),
            streams: self.settings(),
        }
    }
}

/// A number of hours as a flag gives it (`24`, `0.05`), as a duration: not negative, not
/// beyond what a duration holds.
pub fn parse_hours(text: &str) -> Result<Duration, String> {
    let hours: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of hours"))?;
    Duration::try_from_secs_f64(hours * 3600.0)
        .map_err(|_| format!("{text:?} hours is not a duration (negative, or too long)"))
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::parse_hours;

    #[test]
    fn hours_may_be_fractions_but_not_negative() {
        for (text, hours) in [
            ("168", Some(Duration::from_secs(168 * 3600))),
            ("0", Some(Duration::ZERO)),
            ("0.05", Some(Duration::from_secs(180))),
            (" 2 ", Some(Duration::from_secs(7200))),
            ("-1", None),
            ("NaN", None),
            ("1e300", None),
            ("a day", None),
        ] {
            assert_eq!(parse_hours(text).ok(), hours, "{text:?}");
        }
    }
}

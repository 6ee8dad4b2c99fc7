//! Connecting to NATS: who the component is to the server (credentials from files, never from
//! flags or URLs in the logs), how the connection is secured (TLS, a private CA, a client
//! certificate), and retrying with backoff while the server is away, never while it says no.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::{ConnectErrorKind, ConnectOptions};

/// How a component proves who it is to NATS. Secrets come from files: a flag or an
/// environment variable holds only the path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NatsCredentials {
    /// No credentials, or what the URL carries (`user:password@` or `token@`).
    #[default]
    Anonymous,
    /// A `.creds` file: a user JWT and its nkey seed.
    CredsFile(PathBuf),
    /// A file holding an nkey seed (`SU...`).
    NkeySeedFile(PathBuf),
    /// A user name, with the password read from a file.
    UserPassword {
        /// The user name.
        user: String,
        /// The file holding the password.
        password_file: PathBuf,
    },
    /// A file holding a token.
    TokenFile(PathBuf),
}

impl NatsCredentials {
    /// The method's name, for errors: never a secret.
    pub fn method(&self) -> &'static str {
        match self {
            NatsCredentials::Anonymous => "the URL's credentials, or none",
            NatsCredentials::CredsFile(_) => "a credentials file",
            NatsCredentials::NkeySeedFile(_) => "an nkey",
            NatsCredentials::UserPassword { .. } => "a user and password",
            NatsCredentials::TokenFile(_) => "a token",
        }
    }
}

/// TLS beyond what a `tls://` URL asks for (TLS is always required for one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// PEM file of the CA certificates the server's certificate is checked against.
    pub ca: Option<PathBuf>,
    /// PEM files of the client certificate and its key, for mutual TLS.
    pub client: Option<(PathBuf, PathBuf)>,
    /// Refuse a connection without TLS even to a `nats://` URL.
    pub required: bool,
}

/// Credentials and TLS: everything about a NATS connection beyond the server's address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsSecurity {
    /// Who the component is.
    pub credentials: NatsCredentials,
    /// How the connection is secured.
    pub tls: NatsTls,
}

/// Why a component could not connect, when retrying would not help.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A credentials, key or certificate file could not be read.
    #[error("reading {what} {}: {source}", path.display())]
    File {
        /// What the file was to hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The server refused the credentials.
    #[error("NATS at {servers} refused {method}: {reason}")]
    Refused {
        /// The servers, redacted.
        servers: String,
        /// How the component tried to authenticate.
        method: &'static str,
        /// What the server or client said.
        reason: String,
    },
    /// TLS could not be set up: a certificate that does not verify, a server without TLS.
    #[error("NATS at {servers}: TLS failed: {reason}")]
    Tls {
        /// The servers, redacted.
        servers: String,
        /// What failed.
        reason: String,
    },
    /// A server URL does not parse: no retry can make it reachable.
    #[error("invalid NATS URL {server}: {reason}")]
    Url {
        /// The server as given, redacted.
        server: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server is older than podstream needs.
    #[error(
        "NATS at {servers} runs nats-server {version}; podstream needs {MIN_SERVER_VERSION} or later (pinned consumers, the processor's single puller)"
    )]
    ServerTooOld {
        /// The servers, redacted.
        servers: String,
        /// The version the server announced.
        version: String,
    },
}

/// The oldest nats-server podstream runs on: the processor's pull consumer uses the pinned
/// client priority group, which 2.11 introduced.
pub const MIN_SERVER_VERSION: &str = "2.11.0";

/// Whether a server announcing `version` (`2.11.4`, `v2.10.22`, `2.12.0-beta.1`) is one
/// podstream runs on. A version that does not parse is let through: a server built from source
/// may announce anything, and the consumer calls then fail with the server's own words.
///
/// ```
/// use podstream_bus::connect::server_version_supported;
/// assert!(server_version_supported("2.15.1"));
/// assert!(!server_version_supported("2.10.22"));
/// ```
pub fn server_version_supported(version: &str) -> bool {
    fn numbers(version: &str) -> Option<(u64, u64)> {
        let mut parts = version.trim().trim_start_matches('v').split(['.', '-']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    }
    match (numbers(version), numbers(MIN_SERVER_VERSION)) {
        (Some(found), Some(needed)) => found >= needed,
        _ => true,
    }
}

/// The servers of `url` (comma-separated), each checked as a NATS server address: a scheme
/// the client speaks (`nats`, `tls`, `ws`, `wss`; none means `nats`) and a host.
pub fn servers(url: &str) -> Result<Vec<&str>, ConnectError> {
    let servers: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|server| !server.is_empty())
        .collect();
    if servers.is_empty() {
        return Err(ConnectError::Url {
            server: redacted(url),
            reason: "no server in it".into(),
        });
    }
    for server in &servers {
        let invalid = |reason: String| ConnectError::Url {
            server: redacted(server),
            reason,
        };
        let address = server
            .parse::<async_nats::ServerAddr>()
            .map_err(|error| invalid(error.to_string()))?;
        if address.host().is_empty() {
            return Err(invalid("no host in it".into()));
        }
    }
    Ok(servers)
}

/// `url` (one server, or several comma-separated) with every password or token replaced by
/// `***`, for logs and errors.
pub fn redacted(url: &str) -> String {
    url.split(',')
        .map(|server| {
            let server = server.trim();
            let authority_at = server.find("://").map_or(0, |i| i + 3);
            let (scheme, rest) = server.split_at(authority_at);
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            match authority.rsplit_once('@') {
                Some((userinfo, host)) => {
                    let userinfo = match userinfo.split_once(':') {
                        Some((user, _)) => format!("{user}:***"),
                        None => "***".to_owned(),
                    };
                    format!("{scheme}{userinfo}@{host}{path}")
                }
                None => server.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Connects to `url` (one server, or several comma-separated: the members of a cluster) as
/// `security` says. While no server answers it retries with exponential backoff (up to 30 s
/// between attempts), logging each attempt; refused credentials or failed TLS end it with a
/// [`ConnectError`], since retrying cannot help. Once connected, the client reconnects by
/// itself after a lost connection, to any member.
pub async fn connect(
    url: &str,
    security: &NatsSecurity,
    name: &str,
) -> Result<async_nats::Client, ConnectError> {
    let servers = servers(url)?;
    let shown = redacted(url);
    let secrets = match &security.credentials {
        NatsCredentials::Anonymous => Secrets::in_url(&servers),
        credentials => Secrets::read(credentials).await?,
    };
    let mut backoff = crate::Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
    let mut attempt = 1u32;
    loop {
        let options = options(security, &secrets, name)?;
        match options.connect(servers.as_slice()).await {
            Ok(client) => {
                let version = client.server_info().version;
                if !server_version_supported(&version) {
                    return Err(ConnectError::ServerTooOld {
                        servers: shown,
                        version,
                    });
                }
                tracing::info!(url = %shown, %version, "connected to NATS");
                return Ok(client);
            }
            Err(error) => match error.kind() {
                ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                    return Err(ConnectError::Refused {
                        servers: shown,
                        method: security.credentials.method(),
                        reason: error.to_string(),
                    });
                }
                _ if error.kind() == ConnectErrorKind::Tls || is_tls_failure(&error) => {
                    return Err(ConnectError::Tls {
                        servers: shown,
                        reason: error.to_string(),
                    });
                }
                _ => {
                    tracing::warn!(url = %shown, attempt, retry_in_ms = backoff.delay().as_millis() as u64, %error, "NATS unreachable; retrying");
                    backoff.wait().await;
                    attempt += 1;
                }
            },
        }
    }
}

/// The subject prefix of the replies a client named `name` receives: `_INBOX_<name>`.
pub fn inbox_prefix(name: &str) -> String {
    format!("_INBOX_{name}")
}

/// Whether `error`, or an error it was caused by, is TLS itself failing (a certificate
/// missing, unknown or refused): a handshake's error arrives as an I/O error holding
/// rustls' own, and no retry changes its outcome. NATS and the database connect over the
/// same rustls.
pub fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::rustls;
    let mut cause = Some(error);
    while let Some(error) = cause {
        let tls = error.is::<rustls::Error>()
            || error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .is_some_and(|inner| inner.is::<rustls::Error>());
        if tls {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The secrets of `credentials`, read once at start so a missing file is a clear error.
enum Secrets {
    None,
    Creds { path: PathBuf, creds: String },
    Nkey(String),
    Password(String, String),
    Token(String),
}

impl Secrets {
    /// What the first server URL with user info carries, as other NATS clients take it: a
    /// user and password, or a lone token (async-nats itself ignores it).
    fn in_url(servers: &[&str]) -> Secrets {
        servers
            .iter()
            .filter_map(|server| server.parse::<async_nats::ServerAddr>().ok())
            .find_map(|addr| {
                let user = addr.username()?.to_owned();
                Some(match addr.password() {
                    Some(password) => Secrets::Password(user, password.to_owned()),
                    None => Secrets::Token(user),
                })
            })
            .unwrap_or(Secrets::None)
    }

    async fn read(credentials: &NatsCredentials) -> Result<Secrets, ConnectError> {
        Ok(match credentials {
            NatsCredentials::Anonymous => Secrets::None,
            NatsCredentials::CredsFile(path) => Secrets::Creds {
                path: path.clone(),
                creds: read("credentials file", path).await?,
            },
            NatsCredentials::NkeySeedFile(path) => {
                Secrets::Nkey(read("nkey seed file", path).await?.trim().to_owned())
            }
            NatsCredentials::UserPassword {
                user,
                password_file,
            } => Secrets::Password(
                user.clone(),
                read("password file", password_file)
                    .await?
                    .trim_end_matches(['\r', '\n'])
                    .to_owned(),
            ),
            NatsCredentials::TokenFile(path) => {
                Secrets::Token(read("token file", path).await?.trim().to_owned())
            }
        })
    }
}

async fn read(what: &'static str, path: &Path) -> Result<String, ConnectError> {
    tokio::fs::read_to_string(path)
        .await
        .map_err(|source| ConnectError::File {
            what,
            path: path.to_owned(),
            source,
        })
}

fn options(
    security: &NatsSecurity,
    secrets: &Secrets,
    name: &str,
) -> Result<ConnectOptions, ConnectError> {
    let mut options = match secrets {
        Secrets::None => ConnectOptions::new(),
        Secrets::Creds { path, creds } => {
            ConnectOptions::with_credentials(creds).map_err(|source| ConnectError::File {
                what: "credentials file",
                path: path.clone(),
                source,
            })?
        }
        Secrets::Nkey(seed) => ConnectOptions::with_nkey(seed.clone()),
        Secrets::Password(user, password) => {
            ConnectOptions::with_user_and_password(user.clone(), password.clone())
        }
        Secrets::Token(token) => ConnectOptions::with_token(token.clone()),
    };
    if let Some(ca) = &security.tls.ca {
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &security.tls.client {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    if security.tls.required {
        options = options.require_tls(true);
    }
    Ok(options
        .name(name)
        // Replies come to the component's own inbox, so a server can let each user read
        // only its own (deploy/nats/podstream-users.conf).
        .custom_inbox_prefix(inbox_prefix(name))
        .connection_timeout(Duration::from_secs(5))
        // Unlimited: a NATS restart must never end the component.
        .max_reconnects(None)
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Disconnected => {
                    tracing::warn!("disconnected from NATS; reconnecting")
                }
                async_nats::Event::Connected => tracing::info!("connected to NATS"),
                // A permissions violation: this component's user may not do what it tried.
                async_nats::Event::ServerError(error) => {
                    tracing::error!(%error, "NATS refused an operation")
                }
                other => tracing::debug!(%other, "NATS event"),
            }
        }))
}

#[cfg(test)]
mod tests {
    use super::{ConnectError, redacted, server_version_supported, servers};

    /// Servers before 2.11 lack the pinned consumers podstream's processor pulls through.
    #[test]
    fn servers_before_2_11_are_refused() {
        for (version, supported) in [
            ("2.11.0", true),
            ("2.11.4", true),
            ("v2.12.1", true),
            ("2.15.1", true),
            ("3.0.0", true),
            ("2.12.0-beta.1", true),
            ("2.10.22", false),
            ("v2.10.0", false),
            ("2.9.25", false),
            ("1.99.0", false),
            ("dev", true),
            ("", true),
        ] {
            assert_eq!(server_version_supported(version), supported, "{version}");
        }
    }

    /// A URL that can never reach a server is an error at once, with the URL (redacted) and
    /// what is wrong; the forms other NATS clients take still read.
    #[test]
    fn unparsable_servers_are_refused_at_once() {
        for url in [
            "nats://",
            "not a url:::",
            "",
            " , ",
            "http://nats:4222",
            "nats://u:s3cret@:4222",
        ] {
            match servers(url) {
                Err(error @ ConnectError::Url { .. }) => {
                    assert!(!error.to_string().contains("s3cret"), "{error}");
                }
                other => panic!("{url:?}: {other:?}"),
            }
        }
        for (url, count) in [
            ("nats://127.0.0.1:4222", 1),
            ("localhost:4222", 1),
            ("tls://nats.example:4222, nats://b:4222", 2),
            ("nats://user:pw@nats:4222", 1),
        ] {
            assert_eq!(servers(url).map(|s| s.len()).ok(), Some(count), "{url}");
        }
    }

    #[test]
    fn no_url_shows_its_password_or_token() {
        let cases = [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            (
                "nats://ingest:s3cret@nats:4222",
                "nats://ingest:***@nats:4222",
            ),
            (
                "tls://t0ken@nats.example:4222",
                "tls://***@nats.example:4222",
            ),
            ("user:pw@host:4222", "user:***@host:4222"),
            (
                "nats://a:p@one:4222, nats://b:q@two:4222",
                "nats://a:***@one:4222,nats://b:***@two:4222",
            ),
            ("nats://u:p@w@host/x?y=@", "nats://u:***@host/x?y=@"),
            ("", ""),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }
}

//! The exit status of a failed command, by what failed: a script or an orchestrator can tell
//! a mistake in its own configuration (do not restart) from a service that is away (retry
//! later) without reading the message. The numbers are BSD's `sysexits.h`, which other tools
//! use too; clap itself exits 2 on a usage error.

use std::process::ExitCode;

use podstream_bus::connect::ConnectError;
use podstream_bus::fault::{Classified, Fault};
use podstream_bus::local_server::LocalServerError;
use podstream_bus::streams::StreamError;
use podstream_sink::db::DbError;

/// Why a command ended without success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Anything not classified below.
    Failure = 1,
    /// The database is not one podstream can work on (not Airflow's, an unknown schema).
    Data = 65,
    /// A service the command needs cannot be used: nats-server missing or too old, the
    /// database or the Kubernetes API refusing what podstream asked.
    Unavailable = 69,
    /// The command's configuration is wrong: a URL that names nothing, credentials refused,
    /// a secret file that cannot be read, a kubeconfig that does not load, a Kubernetes Role
    /// that lacks a permission the ingest needs.
    Config = 78,
}

impl Exit {
    /// The class of `error`: the fault its first typed cause says it is (each library's
    /// errors say it themselves, [`Classified`]).
    pub fn of(error: &anyhow::Error) -> Exit {
        error
            .chain()
            .find_map(fault_of)
            .map_or(Exit::Failure, Exit::from)
    }
}

impl From<Fault> for Exit {
    fn from(fault: Fault) -> Exit {
        match fault {
            Fault::Configuration => Exit::Config,
            Fault::Unavailable => Exit::Unavailable,
            Fault::Data => Exit::Data,
            Fault::Other => Exit::Failure,
        }
    }
}

/// The fault `cause` says it is, when its type is one that says.
fn fault_of(cause: &(dyn std::error::Error + 'static)) -> Option<Fault> {
    fn said<E: Classified + std::error::Error + 'static>(
        cause: &(dyn std::error::Error + 'static),
    ) -> Option<Fault> {
        cause.downcast_ref::<E>().map(Classified::fault)
    }
    said::<crate::check::ChecksFailed>(cause)
        .or_else(|| said::<podstream_sink::service::SinkError>(cause))
        .or_else(|| said::<podstream_bus::StageError>(cause))
        .or_else(|| said::<podstream_ingest::service::IngestError>(cause))
        .or_else(|| said::<podstream_ingest::service::KubeClientError>(cause))
        .or_else(|| said::<DbError>(cause))
        .or_else(|| said::<podstream_bus::StartError>(cause))
        .or_else(|| said::<ConnectError>(cause))
        .or_else(|| said::<StreamError>(cause))
        .or_else(|| said::<LocalServerError>(cause))
        .or_else(|| {
            (cause.is::<kube::config::InferConfigError>()
                || cause.is::<kube::config::KubeconfigError>()
                || cause.is::<crate::offline::decide::SigningKeyError>())
            .then_some(Fault::Configuration)
        })
        .or_else(|| cause.is::<sqlx::Error>().then_some(Fault::Unavailable))
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::Exit;
    use podstream_bus::connect::ConnectError;
    use podstream_bus::local_server::LocalServerError;
    use podstream_sink::db::DbError;

    /// Each class from the error that decides it, however deep in the chain.
    #[test]
    fn an_error_exits_with_its_class() {
        let table: [(anyhow::Error, Exit); 8] = [
            (
                anyhow::Error::new(DbError::Url("x".into(), "no".into())).context("starting"),
                Exit::Config,
            ),
            (
                anyhow::Error::new(ConnectError::Url {
                    server: "x".into(),
                    reason: "no".into(),
                }),
                Exit::Config,
            ),
            (
                anyhow::Error::new(ConnectError::ServerTooOld {
                    servers: "x".into(),
                    version: "2.10.0".into(),
                }),
                Exit::Unavailable,
            ),
            (
                anyhow::Error::new(LocalServerError::Spawn {
                    binary: "nats-server".into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                })
                .context("starting the local nats-server"),
                Exit::Unavailable,
            ),
            (
                anyhow::Error::new(DbError::NotAirflow("no table".into())),
                Exit::Data,
            ),
            (
                anyhow::Error::new(sqlx::Error::PoolTimedOut).context("applying"),
                Exit::Unavailable,
            ),
            (
                anyhow::Error::new(podstream_ingest::service::IngestError::from(
                    podstream_ingest::access::Forbidden {
                        missing: Vec::new(),
                    },
                ))
                .context("starting the ingest"),
                Exit::Config,
            ),
            (anyhow::anyhow!("a story did not end right"), Exit::Failure),
        ];
        for (error, exit) in table {
            assert_eq!(Exit::of(&error), exit, "{error:#}");
        }
    }
}

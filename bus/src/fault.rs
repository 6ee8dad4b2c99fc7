//! Whose move a failure is, said by the failure's own type: a component that stops tells a
//! mistake in its configuration (fix it, do not restart) from a service that is away (try
//! again later) and from data it cannot work on. The CLI turns it into an exit status.

/// What kind of failure stopped a component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The configuration is wrong: a URL that names nothing, credentials refused, a file that
    /// cannot be read, a permission missing.
    Configuration,
    /// A service it needs cannot be used now: missing, too old, refusing.
    Unavailable,
    /// The data is not what it works on (a database that is not Airflow's).
    Data,
    /// Anything else.
    Other,
}

/// A failure that knows its [`Fault`].
pub trait Classified {
    /// What kind of failure this is.
    fn fault(&self) -> Fault;
}

impl Classified for crate::connect::ConnectError {
    fn fault(&self) -> Fault {
        use crate::connect::ConnectError;
        match self {
            ConnectError::ServerTooOld { .. } => Fault::Unavailable,
            ConnectError::File { .. }
            | ConnectError::Refused { .. }
            | ConnectError::Tls { .. }
            | ConnectError::Url { .. } => Fault::Configuration,
        }
    }
}

impl Classified for crate::start::StartError {
    fn fault(&self) -> Fault {
        use crate::start::StartError;
        match self {
            StartError::Prefix(_) => Fault::Configuration,
            StartError::Connect(error) => error.fault(),
            StartError::Stream(error) => error.fault(),
        }
    }
}

impl Classified for crate::start::StageError {
    fn fault(&self) -> Fault {
        use crate::start::StageError;
        match self {
            StageError::Bus(error) => error.fault(),
            StageError::Bucket { source, .. } => source.fault(),
            StageError::Stream { .. } | StageError::Bind(_) => Fault::Other,
        }
    }
}

impl Classified for crate::streams::StreamError {
    fn fault(&self) -> Fault {
        use crate::streams::StreamError;
        match self {
            // Another deployment's stream, or an operator's settings podstream will not undo.
            StreamError::Conflict { .. } => Fault::Configuration,
            _ => Fault::Other,
        }
    }
}

impl Classified for crate::local_server::LocalServerError {
    fn fault(&self) -> Fault {
        Fault::Unavailable
    }
}

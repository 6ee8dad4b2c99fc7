//! What the sink applies and what became of it: the vocabulary every sink module shares.

use podstream_proto::Command;

use crate::guard::{Effect, Skip};

/// A command and where it came from.
#[derive(Debug, Clone)]
pub struct Item {
    /// The command.
    pub command: Command,
    /// Its JetStream stream sequence, when it came from the bus.
    pub sequence: Option<u64>,
}

/// What became of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied, with this effect.
    Applied(Effect),
    /// Left alone, for this reason.
    Skipped(Skip),
    /// Cannot ever be applied (bad data, a constraint): for the dead letters, with the reason.
    Dead(String),
}

//! The flag of how long the sink keeps applied command ids, shared by `sink` and `run`.

use std::time::Duration;

use clap::Args;
use podstream_sink::retention::{RetentionTooShort, applied_retention};

/// How long `podstream_applied` keeps command ids.
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// Hours `podstream_applied` keeps the ids of applied commands; older ones are pruned
    /// hourly. At least --max-age-hours (a command still in the stream must not apply
    /// twice); 0 keeps them forever. Default: --max-age-hours plus 24.
    #[arg(long, env = "PODSTREAM_APPLIED_RETENTION_HOURS")]
    pub applied_retention_hours: Option<u64>,
}

impl RetentionArgs {
    /// The retention for a commands stream kept for `stream_max_age`.
    pub fn retention(
        &self,
        stream_max_age: Duration,
    ) -> Result<Option<Duration>, RetentionTooShort> {
        applied_retention(self.applied_retention_hours, stream_max_age)
    }
}

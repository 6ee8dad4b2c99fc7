//! The flag of how long the sink keeps applied command ids, shared by `sink` and `run`.

use clap::Args;

/// How long `podstream_applied` keeps command ids.
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// Hours `podstream_applied` keeps the ids of applied commands (fractions allowed);
    /// older ones are pruned hourly, or four times per retention when that is shorter. At
    /// least the commands stream's max age, as the stream has it (a command still in the
    /// stream must not apply twice); 0 keeps them forever. Default: the stream's max age plus
    /// 24, or forever for a stream that keeps commands forever.
    #[arg(long, env = "PODSTREAM_APPLIED_RETENTION_HOURS", value_parser = crate::args::stream::parse_hours)]
    pub applied_retention_hours: Option<std::time::Duration>,
}

//! The ingest's leader election flags, shared by `ingest` and `run`.

use std::time::Duration;

use clap::Args;
use podstream_ingest::leadership::{DEFAULT_LEASE_DURATION_SECONDS, LEASE_ROLE, LeaseConfig};
use podstream_proto::subject::Subjects;

/// Which Lease elects one ingest among replicas.
#[derive(Debug, Clone, Args)]
pub struct LeaseArgs {
    /// Namespace of the Lease that elects one ingest: the pod's own in a cluster, else
    /// `default`.
    #[arg(long, env = "PODSTREAM_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Name of the Lease [default: <prefix>-ingest]. The holder identity is $POD_NAME (else
    /// the host name), `_` and a suffix unique to the process.
    #[arg(long, env = "PODSTREAM_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// Seconds the Lease lasts unrenewed: a standby takes over a dead leader's after about
    /// this, and a leader stops writing a fifth of it before its lease could expire.
    #[arg(
        long,
        env = "PODSTREAM_LEASE_DURATION_SECONDS",
        default_value_t = DEFAULT_LEASE_DURATION_SECONDS,
        value_parser = clap::value_parser!(u64).range(2..)
    )]
    pub lease_duration_seconds: u64,
    /// Run without leader election: for exactly one ingest per cluster, or a cluster where
    /// the ingest may not write Leases.
    #[arg(long, env = "PODSTREAM_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
}

impl LeaseArgs {
    /// The Lease to compete for, or `None` without an election; unnamed, it is the
    /// prefix's (`subjects`).
    pub fn lease(&self, subjects: &Subjects) -> Option<LeaseConfig> {
        if self.no_leader_election {
            return None;
        }
        let defaults = LeaseConfig::new();
        Some(LeaseConfig {
            namespace: self.lease_namespace.clone().unwrap_or(defaults.namespace),
            name: self
                .lease_name
                .clone()
                .unwrap_or_else(|| subjects.resource_name(LEASE_ROLE)),
            duration: Duration::from_secs(self.lease_duration_seconds),
            ..defaults
        })
    }
}

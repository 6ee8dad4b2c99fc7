//! What the collector deletes, and when: the flags of `collect` and of `run --collect-pods`.

use std::time::Duration;

use clap::{ArgAction, Args};
use podstream_collector::rule::{self, Settings};

/// Airflow's `[kubernetes_executor]` pod settings, the grace period and live pods.
#[derive(Debug, Clone, Args)]
pub struct CollectionArgs {
    /// Delete a worker pod once its try ended, as Airflow's `[kubernetes_executor]
    /// delete_worker_pods` (give it the same value); `false` labels it
    /// `airflow_executor_done=True` instead.
    #[arg(long, env = "PODSTREAM_DELETE_WORKER_PODS", action = ArgAction::Set, default_value_t = rule::DEFAULT_DELETE_WORKER_PODS)]
    pub delete_worker_pods: bool,
    /// Delete failed worker pods too, as Airflow's `delete_worker_pods_on_failure`; `false`
    /// leaves them for inspection.
    #[arg(long, env = "PODSTREAM_DELETE_WORKER_PODS_ON_FAILURE", action = ArgAction::Set, default_value_t = rule::DEFAULT_DELETE_WORKER_PODS_ON_FAILURE)]
    pub delete_worker_pods_on_failure: bool,
    /// Seconds a losing duplicate, or a pod of a try that a later try superseded, stays before
    /// it is deleted.
    #[arg(long, env = "PODSTREAM_COLLECT_GRACE_SECONDS", default_value_t = rule::DEFAULT_GRACE_SECONDS)]
    pub collect_grace_seconds: u64,
    /// Delete live losing duplicates and live pods of superseded tries too (after the grace
    /// period). Only where the processor runs with --require-signed-pods: without signatures a
    /// copy that wins the order would get the real pod deleted.
    #[arg(long, env = "PODSTREAM_COLLECT_LIVE_PODS")]
    pub collect_live_pods: bool,
}

impl CollectionArgs {
    /// The collection rule's settings these flags describe, for pods in `namespaces` (none:
    /// every namespace).
    pub fn settings(&self, namespaces: Vec<String>) -> Settings {
        Settings {
            delete_worker_pods: self.delete_worker_pods,
            delete_worker_pods_on_failure: self.delete_worker_pods_on_failure,
            grace: Duration::from_secs(self.collect_grace_seconds),
            live_pods: self.collect_live_pods,
            namespaces,
        }
    }
}

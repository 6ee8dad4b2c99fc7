//! Leader election: one ingest publishes, standbys wait with their connections open.
//!
//! The election is a `coordination.k8s.io/v1` Lease held through `kube-lease-manager`. Being
//! elected is not enough to write: a leader paused past its lease (SIGSTOP, a long GC, a
//! frozen VM) wakes believing it still leads. So the leader also holds a [`Fence`], a deadline
//! on its own clock that only its observed renewals move: it ends before the lease can expire
//! for anyone else, and nothing is published or checkpointed after it. The checkpoint adds a
//! second, independent fence: every write is a compare-and-set (see `checkpoint`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The Lease's name by default.
pub const DEFAULT_LEASE_NAME: &str = "podstream-ingest";
/// The role in the name of a prefix's Lease (`<prefix>-ingest`).
pub const LEASE_ROLE: &str = "ingest";
/// Seconds a lease lasts unrenewed by default: a standby takes over a dead leader's within
/// about this plus one.
pub const DEFAULT_LEASE_DURATION_SECONDS: u64 = 10;
/// The namespace outside a cluster.
const DEFAULT_NAMESPACE: &str = "default";
/// Where a pod reads its own namespace.
const IN_CLUSTER_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The Lease an ingest competes for, and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This ingest's holder identity, unique per process.
    pub identity: String,
    /// How long the lease lasts unrenewed.
    pub duration: Duration,
    /// `$POD_NAME`, when this ingest runs in a pod: a Lease held by an earlier incarnation of
    /// the same pod (a restarted container) is taken back at once, not waited out.
    pub pod: Option<String>,
}

impl LeaseConfig {
    /// The defaults: the pod's namespace in a cluster (else `default`), [`DEFAULT_LEASE_NAME`],
    /// [`identity`], [`DEFAULT_LEASE_DURATION_SECONDS`].
    pub fn new() -> LeaseConfig {
        LeaseConfig {
            namespace: default_namespace(),
            name: DEFAULT_LEASE_NAME.into(),
            identity: identity(),
            duration: Duration::from_secs(DEFAULT_LEASE_DURATION_SECONDS),
            pod: pod_name(),
        }
    }

    /// Whether `holder` is an earlier incarnation of this ingest's pod: the same `$POD_NAME`,
    /// another process suffix. A pod's name is unique among live pods of its namespace, so
    /// that incarnation's container has ended. Off Kubernetes (no `$POD_NAME`) nothing is:
    /// a host name does not tell a restarted process from another replica on the same host.
    pub fn is_own_pods_earlier_holder(&self, holder: &str) -> bool {
        let Some(pod) = &self.pod else {
            return false;
        };
        holder != self.identity
            && holder
                .rsplit_once('_')
                .is_some_and(|(base, suffix)| base == pod && is_suffix(suffix))
    }

    /// Seconds before the lease's expiry it is renewed (the library's grace): half the lease,
    /// at least one second, so a renewal is seen well before the write deadline.
    fn grace_seconds(&self) -> u64 {
        (self.duration.as_secs() / 2).max(1)
    }

    /// How long before the lease's expiry the leader stops writing: room for clocks that
    /// disagree and for a write already on the wire.
    fn margin(&self) -> Duration {
        self.duration / 5
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig::new()
    }
}

/// The pod's namespace in a cluster, else `default`.
pub fn default_namespace() -> String {
    std::fs::read_to_string(IN_CLUSTER_NAMESPACE)
        .ok()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.into())
}

/// `$POD_NAME`, when set.
fn pod_name() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty())
}

/// The length of the process suffix of an identity.
const SUFFIX_LEN: usize = 8;

/// Whether `suffix` is what [`identity`] appends.
fn is_suffix(suffix: &str) -> bool {
    suffix.len() == SUFFIX_LEN && suffix.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `$POD_NAME` (else the host name), `_`, and a suffix unique to this process: a restarted
/// container is a new candidate, never mistaken for the holder it replaces (it takes the
/// Lease back from that holder at once, see [`LeaseConfig::is_own_pods_earlier_holder`]).
pub fn identity() -> String {
    let base = pod_name()
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|host| host.trim().to_owned())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "podstream-ingest".into());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{base}_{}", &suffix[..SUFFIX_LEN])
}

/// The ingest stopped leading: it must write nothing more.
#[derive(Debug, thiserror::Error)]
#[error("this ingest no longer leads: {0}")]
pub struct Deposed(pub String);

/// The leader's write deadline, shared by everything that writes. A fence without a deadline
/// (no election) always holds.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    /// Unix milliseconds after which nothing may be written; absent for no election.
    deadline: Option<Arc<AtomicU64>>,
}

impl Fence {
    /// A fence that always holds: the ingest runs without an election.
    pub fn open() -> Fence {
        Fence { deadline: None }
    }

    /// Whether writing is still allowed now.
    pub fn holds(&self) -> bool {
        self.deadline.as_ref().is_none_or(|deadline| {
            unix_millis(SystemTime::now()) < deadline.load(Ordering::Acquire)
        })
    }

    /// `Ok` while writing is allowed, else [`Deposed`].
    pub fn check(&self) -> Result<(), Deposed> {
        if self.holds() {
            Ok(())
        } else {
            Err(Deposed("the lease ran out before it was renewed".into()))
        }
    }

    fn closing_at(deadline: u64) -> Fence {
        Fence {
            deadline: Some(Arc::new(AtomicU64::new(deadline))),
        }
    }

    fn move_to(&self, deadline: u64) {
        if let Some(at) = &self.deadline {
            at.store(deadline, Ordering::Release);
        }
    }
}

/// A held lease: its fence, and a signal when it is lost.
pub struct Leadership {
    /// The write deadline.
    pub fence: Fence,
    leading: watch::Receiver<bool>,
    manager:
        JoinHandle<Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>>,
    renewals: JoinHandle<()>,
}

/// Why this ingest could not come to lead.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The Lease could not be read or created.
    #[error(
        "opening the Lease {namespace}/{name} (the ingest needs get, create and patch on leases)"
    )]
    Open {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// Why.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The lease manager ended before electing this ingest.
    #[error("the lease manager stopped before this ingest led")]
    ManagerStopped(#[source] watch::error::RecvError),
    /// The Lease could not be read after the election.
    #[error("reading the Lease {name}")]
    Read {
        /// The Lease's name.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Elected, yet the Lease read next names another holder.
    #[error("elected, but the Lease names another holder")]
    NotHeld,
}

impl Leadership {
    /// Waits until this ingest holds the lease (creating it if needed).
    pub async fn acquire(
        kube: kube::Client,
        config: &LeaseConfig,
    ) -> Result<Leadership, LeaseError> {
        let api: Api<Lease> = Api::namespaced(kube.clone(), &config.namespace);
        reclaim_from_own_pod(&api, config).await;
        let manager = LeaseManagerBuilder::new(kube.clone(), &config.name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(config.duration.as_secs().max(2))
            .with_grace(config.grace_seconds())
            .with_create_mode(LeaseCreateMode::AutoCreate)
            .build()
            .await
            .map_err(|source| LeaseError::Open {
                namespace: config.namespace.clone(),
                name: config.name.clone(),
                source,
            })?;
        let (mut leading, manager) = manager.watch().await;
        tracing::info!(lease = %config.name, namespace = %config.namespace, identity = %config.identity, "waiting to lead");
        while !*leading.borrow_and_update() {
            leading
                .changed()
                .await
                .map_err(LeaseError::ManagerStopped)?;
        }
        let deadline = renewed_deadline(&api, config)
            .await?
            .ok_or(LeaseError::NotHeld)?;
        let fence = Fence::closing_at(deadline);
        let renewals = tokio::spawn(follow_renewals(api, config.clone(), fence.clone()));
        tracing::info!(lease = %config.name, identity = %config.identity, "leading");
        Ok(Leadership {
            fence,
            leading,
            manager,
            renewals,
        })
    }

    /// Resolves when the lease is lost (or its manager stopped).
    pub async fn lost(&mut self) {
        while *self.leading.borrow_and_update() {
            if self.leading.changed().await.is_err() {
                return;
            }
        }
    }

    /// Gives the lease up, so a standby takes over at once instead of after it expires.
    pub async fn release(self) {
        self.renewals.abort();
        self.fence.move_to(0);
        drop(self.leading);
        match tokio::time::timeout(Duration::from_secs(5), self.manager).await {
            Ok(Ok(Ok(_))) => tracing::info!("lease released"),
            Ok(Ok(Err(error))) => {
                tracing::warn!(%error, "releasing the lease failed; it expires on its own")
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "the lease manager failed; the lease expires on its own")
            }
            Err(_) => tracing::warn!("releasing the lease timed out; it expires on its own"),
        }
    }
}

/// When the Lease is held by an earlier incarnation of this pod (killed, its container
/// restarted), frees it so this one leads at once instead of waiting out a lease nobody will
/// renew. The write is conditional on the Lease as read: if anyone renewed or took it
/// meanwhile, nothing changes. Anything that goes wrong only leaves the usual wait.
async fn reclaim_from_own_pod(api: &Api<Lease>, config: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&config.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    let Some(holder) = spec
        .holder_identity
        .take()
        .filter(|holder| config.is_own_pods_earlier_holder(holder))
    else {
        return;
    };
    spec.renew_time = None;
    spec.acquire_time = None;
    // `replace` carries the resourceVersion read: a concurrent change makes it a conflict.
    match api
        .replace(&config.name, &kube::api::PostParams::default(), &lease)
        .await
    {
        Ok(_) => tracing::info!(lease = %config.name, %holder, identity = %config.identity,
            "took the Lease back from this pod's earlier incarnation"),
        Err(error) => tracing::info!(lease = %config.name, %holder, %error,
            "could not take the Lease back from this pod's earlier incarnation; waiting for it"),
    }
}

/// Reads the Lease: the write deadline its last renewal gives this holder, `None` when
/// another holds it.
async fn renewed_deadline(
    api: &Api<Lease>,
    config: &LeaseConfig,
) -> Result<Option<u64>, LeaseError> {
    let lease = api
        .get(&config.name)
        .await
        .map_err(|source| LeaseError::Read {
            name: config.name.clone(),
            source,
        })?;
    let Some(spec) = lease.spec else {
        return Ok(None);
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(None);
    }
    let Some(renewed) = spec.renew_time else {
        return Ok(None);
    };
    let renewed: SystemTime = renewed.0.into();
    let lasts = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(config.duration, Duration::from_secs);
    Ok(Some(unix_millis(
        renewed + lasts.saturating_sub(config.margin()),
    )))
}

/// Moves the fence with every renewal seen; closes it when another holder appears. A failed
/// read moves nothing: the deadline then passes on its own.
async fn follow_renewals(api: Api<Lease>, config: LeaseConfig, fence: Fence) {
    let every = (config.duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        match renewed_deadline(&api, &config).await {
            Ok(Some(deadline)) => fence.move_to(deadline),
            Ok(None) => {
                fence.move_to(0);
                tracing::warn!(lease = %config.name, "the Lease names another holder; writing stops");
                return;
            }
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "cannot read the Lease; the write deadline stays")
            }
        }
    }
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_holds_until_its_deadline_and_an_open_one_always() {
        assert!(Fence::open().holds());
        let now = unix_millis(SystemTime::now());
        let fence = Fence::closing_at(now + 60_000);
        assert!(fence.holds());
        fence.move_to(now.saturating_sub(1));
        assert!(!fence.holds());
        assert!(fence.check().is_err());
        // Clones share the deadline: the publisher's copy closes with the leader's.
        let copy = fence.clone();
        fence.move_to(now + 60_000);
        assert!(copy.holds());
    }

    #[test]
    fn an_identity_is_unique_per_process_and_names_the_pod() {
        let one = identity();
        let two = identity();
        assert_ne!(one, two);
        let (base, suffix) = one.rsplit_once('_').unwrap();
        assert!(!base.is_empty());
        assert_eq!(suffix.len(), 8);
    }

    #[test]
    fn only_an_earlier_incarnation_of_this_pod_is_reclaimed_from() {
        let config = |pod: Option<&str>| LeaseConfig {
            identity: "ingest-0_0123abcd".into(),
            pod: pod.map(str::to_owned),
            ..LeaseConfig::new()
        };
        let in_pod = config(Some("ingest-0"));
        let table = [
            ("ingest-0_89abcdef", true),
            ("ingest-0_0123abcd", false), // this process itself
            ("ingest-1_89abcdef", false), // another replica
            ("ingest-0-x_89abcdef", false),
            ("ingest-0_89abcdeg", false), // not a suffix this code writes
            ("ingest-0_89abcde", false),
            ("ingest-0", false),
            ("", false),
        ];
        for (holder, reclaimed) in table {
            assert_eq!(
                in_pod.is_own_pods_earlier_holder(holder),
                reclaimed,
                "{holder}"
            );
        }
        assert!(!config(None).is_own_pods_earlier_holder("ingest-0_89abcdef"));
    }

    #[test]
    fn the_write_deadline_ends_before_the_lease_and_renewal_comes_before_both() {
        let config = LeaseConfig {
            duration: Duration::from_secs(10),
            ..LeaseConfig::new()
        };
        assert_eq!(config.margin(), Duration::from_secs(2));
        // Renewed 5 s before expiry, seen within a second; writing stops 2 s before it.
        assert_eq!(config.grace_seconds(), 5);
        assert!(config.grace_seconds() > config.margin().as_secs() + 1);
    }
}

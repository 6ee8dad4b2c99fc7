//! The simulated cluster: the store behind a lock, the verbs the HTTP layer serves, graceful
//! deletion timers, and the control API tests and the demo drive pods with.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use base64::Engine;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::apply::{self, FieldManager};
use crate::container::{ContainerState, log_path, set_container};
use crate::object::{self, Key, Stored, rfc3339};
use crate::patch::{self, PatchType};
use crate::resource::{CustomResource, Resource, Served};
use crate::selector::Filter;
use crate::status::{ApiError, Reason};
use crate::store::{Event, Store};

/// Namespaces every simulated cluster starts with.
pub const DEFAULT_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// How the simulator behaves where a real cluster is configured.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// How many changes are kept for watches and paged lists; older reads get 410 Gone.
    pub retain_events: usize,
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// Namespaces created at start, beside the four defaults.
    pub namespaces: Vec<String>,
    /// Custom resources served beside the built-in ones.
    pub custom_resources: Vec<&'static CustomResource>,
    /// Host names the server answers to besides loopback ones (`Host` header).
    pub allowed_hosts: Vec<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            retain_events: 50_000,
            bookmark_interval: Duration::from_secs(1),
            namespaces: Vec::new(),
            custom_resources: Vec::new(),
            allowed_hosts: Vec::new(),
        }
    }
}

/// A list request's selection and paging.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// What is selected.
    pub filter: Filter,
    /// `limit`: at most this many items per page.
    pub limit: Option<usize>,
    /// `continue`: the token of the previous page.
    pub continue_token: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`; unset reads as `NotOlderThan`.
    pub resource_version_match: Option<ResourceVersionMatch>,
}

/// How a list's `resourceVersion` is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceVersionMatch {
    /// The state at exactly that revision, from history.
    Exact,
    /// The newest state, which is never older than that revision.
    NotOlderThan,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// The selected objects, in key order.
    pub items: Vec<Arc<Stored>>,
    /// The revision the page was read at.
    pub resource_version: u64,
    /// The token for the next page, if there is one.
    pub continue_token: Option<String>,
}

/// `DeleteOptions` as far as the simulator honours them.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `gracePeriodSeconds`; the resource's default when unset.
    pub grace_period_seconds: Option<u64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

/// What a delete did.
#[derive(Debug, Clone)]
pub enum Deletion {
    /// The object is gone; this is its last state.
    Gone(Arc<Stored>),
    /// A graceful delete began (or goes on); the object is still there.
    Pending(Arc<Stored>),
}

/// The simulated cluster. Cheap to clone; every clone is the same cluster.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    store: Mutex<Store>,
    head: watch::Sender<u64>,
    restarts: watch::Sender<u64>,
    latency_us: AtomicU64,
    config: SimConfig,
    served: Served,
    /// Where a kubelet keeps pod logs, once one runs.
    pod_logs: OnceLock<PathBuf>,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("resource_version", &self.resource_version())
            .finish()
    }
}

impl Cluster {
    /// A cluster with the default namespaces, whose timers run on the current Tokio runtime.
    pub fn new(config: SimConfig) -> Result<Cluster, ApiError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ApiError::new(Reason::InternalError, "the simulator needs a Tokio runtime")
        })?;
        let cluster = Cluster {
            inner: Arc::new(Inner {
                store: Mutex::new(Store::new(config.retain_events)),
                head: watch::channel(0).0,
                restarts: watch::channel(0).0,
                latency_us: AtomicU64::new(0),
                served: Served::new(&config.custom_resources),
                config,
                pod_logs: OnceLock::new(),
                runtime,
            }),
        };
        let mut namespaces: Vec<String> =
            DEFAULT_NAMESPACES.iter().map(|s| s.to_string()).collect();
        namespaces.extend(cluster.inner.config.namespaces.iter().cloned());
        for name in namespaces {
            if cluster
                .get(&Key::new(Resource::Namespaces, "", &name))
                .is_err()
            {
                cluster.create(
                    Resource::Namespaces,
                    "",
                    json!({ "metadata": { "name": name } }),
                    true,
                )?;
            }
        }
        Ok(cluster)
    }

    /// The resources it serves.
    pub fn served(&self) -> &Served {
        &self.inner.served
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // A panic while holding the lock leaves a consistent store: every change is one insert.
        self.inner
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn published(&self, store: MutexGuard<'_, Store>) {
        let head = store.head();
        drop(store);
        self.inner.head.send_replace(head);
    }

    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().head()
    }

    /// Number of changes currently retained for watches.
    pub fn retained_events(&self) -> usize {
        self.store().retained()
    }

    /// Creates an object. `from_api` applies the API's rules (a pod's status is reset).
    pub fn create(
        &self,
        resource: Resource,
        namespace: &str,
        body: Value,
        from_api: bool,
    ) -> Result<Arc<Stored>, ApiError> {
        let value = object::prepare_create(resource, namespace, body, from_api)?;
        let mut store = self.store();
        if resource.namespaced() {
            let ns_key = Key::new(Resource::Namespaces, "", namespace);
            match store.get(&ns_key) {
                None => return Err(ApiError::not_found("", "namespaces", namespace)),
                Some(ns) if ns.deletion.is_some() => {
                    return Err(ApiError::new(
                        Reason::Forbidden,
                        format!(
                            "unable to create new content in namespace {namespace} because it is being terminated"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let stored = store.insert(resource, value)?;
        self.published(store);
        Ok(stored)
    }

    /// The current version of an object, or 404.
    pub fn get(&self, key: &Key) -> Result<Arc<Stored>, ApiError> {
        self.store().get(key).ok_or_else(|| {
            ApiError::not_found(key.resource.group(), key.resource.plural(), &key.name)
        })
    }

    /// One page of a list, read at one consistent revision across pages.
    pub fn list(&self, resource: Resource, query: &ListQuery) -> Result<ListPage, ApiError> {
        let store = self.store();
        let (at, after) = match &query.continue_token {
            Some(token) => {
                let (rv, key) = decode_continue(resource, token)?;
                if rv < store.compacted_through() {
                    return Err(ApiError::new(
                        Reason::Expired,
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (rv, Some(key))
            }
            None => (requested_revision(&store, query)?, None),
        };
        let namespace = query.filter.namespace.as_deref();
        let limit = query.limit.filter(|n| *n > 0).unwrap_or(usize::MAX);
        // One more than a page tells whether another page follows.
        let mut items = store.snapshot(
            resource,
            namespace,
            at,
            after.as_ref(),
            limit.saturating_add(1),
            |o| query.filter.matches(o),
        )?;
        drop(store);
        let more = items.len() > limit;
        items.truncate(limit);
        let continue_token = match (more, items.last()) {
            (true, Some(last)) => Some(encode_continue(at, &last.key)),
            _ => None,
        };
        Ok(ListPage {
            items,
            resource_version: at,
            continue_token,
        })
    }

    /// Replaces an object (PUT), or its status with `status_subresource`.
    pub fn replace(
        &self,
        key: &Key,
        body: Value,
        status_subresource: bool,
        manager: &FieldManager,
    ) -> Result<Arc<Stored>, ApiError> {
        let expected = object::resource_version_of(&body);
        self.update(key, expected, |old| {
            let mut new = object::prepare_update(key.resource, old, body, status_subresource)?;
            apply::record_update(old, &mut new, manager);
            Ok(new)
        })
    }

    /// Patches an object, or its status with `status_subresource`. An apply patch creates
    /// the object when it does not exist, as the API server's does.
    pub fn patch(
        &self,
        key: &Key,
        patch_type: PatchType,
        body: &[u8],
        status_subresource: bool,
        manager: &FieldManager,
    ) -> Result<Arc<Stored>, ApiError> {
        if patch_type == PatchType::Apply {
            let applied = patch::decode(body)?;
            if self.store().get(key).is_none() {
                let mut created = apply::apply(None, &applied, manager)?;
                created["metadata"]["name"] = json!(key.name);
                return self.create(key.resource, &key.namespace, created, true);
            }
            return self.update(key, None, |old| {
                let new = apply::apply(Some(old), &applied, manager)?;
                object::prepare_update(key.resource, old, new, status_subresource)
            });
        }
        self.update(key, None, |old| {
            let patched = patch::apply(patch_type, old, body)?;
            // A resourceVersion written by the patch is a precondition, like a PUT's.
            let wanted = object::resource_version_of(&patched);
            let current = object::resource_version_of(old);
            if wanted.is_some() && wanted != current {
                return Err(conflict(key));
            }
            let mut new = object::prepare_update(key.resource, old, patched, status_subresource)?;
            apply::record_update(old, &mut new, manager);
            Ok(new)
        })
    }

    /// Changes an object freely (status included), as the control API does for the kubelet.
    pub fn modify(
        &self,
        key: &Key,
        change: impl FnOnce(&mut Value),
    ) -> Result<Arc<Stored>, ApiError> {
        self.update(key, None, |old| {
            let mut value = old.clone();
            change(&mut value);
            object::validate(key.resource, &value)?;
            Ok(value)
        })
    }

    fn update(
        &self,
        key: &Key,
        expected_rv: Option<u64>,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Arc<Stored>, ApiError> {
        let mut store = self.store();
        let Some(current) = store.get(key) else {
            return Err(ApiError::not_found(
                key.resource.group(),
                key.resource.plural(),
                &key.name,
            ));
        };
        if expected_rv.is_some_and(|rv| rv != current.resource_version) {
            return Err(conflict(key));
        }
        let old = current.value()?;
        let new = change(&old)?;
        let stored = store.replace(key, new)?;
        // The last finalizer of an object whose grace period is over is gone: so is the object.
        let finished = stored
            .deletion
            .is_some_and(|at| !stored.has_finalizers && at <= Timestamp::now());
        let result = if finished { store.remove(key)? } else { stored };
        self.published(store);
        Ok(result)
    }

    /// Deletes an object: at once with grace 0, else `deletionTimestamp` now and removal later.
    pub fn delete(&self, key: &Key, options: &DeleteOptions) -> Result<Deletion, ApiError> {
        let mut store = self.store();
        let Some(current) = store.get(key) else {
            return Err(ApiError::not_found(
                key.resource.group(),
                key.resource.plural(),
                &key.name,
            ));
        };
        if let Some(uid) = &options.uid
            && *uid != current.uid
        {
            return Err(ApiError::conflict(
                key.resource.group(),
                key.resource.plural(),
                &key.name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current.uid
                ),
            ));
        }
        if let Some(rv) = &options.resource_version
            && *rv != current.resource_version.to_string()
        {
            return Err(ApiError::conflict(
                key.resource.group(),
                key.resource.plural(),
                &key.name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    current.resource_version
                ),
            ));
        }
        if key.resource == Resource::Namespaces {
            // Namespace contents go first, at once; the namespace follows.
            let contents: Vec<Key> = self
                .inner
                .served
                .all()
                .filter(|r| r.namespaced())
                .flat_map(|r| {
                    store
                        .all(r)
                        .filter(|o| o.key.namespace == key.name)
                        .map(|o| o.key.clone())
                        .collect::<Vec<_>>()
                })
                .collect();
            for inner in contents {
                store.remove(&inner)?;
            }
            let last = store.remove(key)?;
            self.published(store);
            return Ok(Deletion::Gone(last));
        }
        let value = current.value()?;
        let grace = options
            .grace_period_seconds
            .unwrap_or_else(|| default_grace(key.resource, &value));
        if grace == 0 && !current.has_finalizers {
            let last = store.remove(key)?;
            self.published(store);
            return Ok(Deletion::Gone(last));
        }
        if let Some(deadline) = current.deletion {
            // Already terminating: a shorter grace period brings the end forward.
            let sooner = Timestamp::now()
                + SignedDuration::from_secs(i64::try_from(grace).unwrap_or(i64::MAX));
            if sooner >= deadline {
                return Ok(Deletion::Pending(current));
            }
        }
        let deadline =
            Timestamp::now() + SignedDuration::from_secs(i64::try_from(grace).unwrap_or(i64::MAX));
        let mut marked = value;
        if let Some(meta) = marked.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("deletionTimestamp".into(), json!(rfc3339(deadline)));
            meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
        }
        let stored = store.replace(key, marked)?;
        self.published(store);
        if grace > 0 {
            let cluster = self.clone();
            let key = key.clone();
            let uid = stored.uid.clone();
            self.inner.runtime.spawn(async move {
                tokio::time::sleep(Duration::from_secs(grace)).await;
                cluster.finish_delete(&key, &uid);
            });
        }
        Ok(Deletion::Pending(stored))
    }

    /// Removes a terminating object whose grace period ended, unless finalizers hold it.
    fn finish_delete(&self, key: &Key, uid: &str) {
        let mut store = self.store();
        let due = store
            .get(key)
            .is_some_and(|o| o.uid == uid && o.deletion.is_some() && !o.has_finalizers);
        if due && store.remove(key).is_ok() {
            self.published(store);
        }
    }

    /// Up to `max` changes after `rv`, or 410 Gone.
    pub fn events_after(&self, rv: u64, max: usize) -> Result<Vec<Event>, ApiError> {
        self.store().events_after(rv, max)
    }

    /// The selected objects now, with the revision they were read at (a watch's start).
    pub fn current(&self, resource: Resource, filter: &Filter) -> (Vec<Arc<Stored>>, u64) {
        let store = self.store();
        let objects = store
            .all(resource)
            .filter(|o| filter.matches(o))
            .cloned()
            .collect();
        (objects, store.head())
    }

    /// A receiver that changes whenever the resourceVersion moves.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.head.subscribe()
    }

    /// A receiver that changes whenever watches are dropped.
    pub fn restarts(&self) -> watch::Receiver<u64> {
        self.inner.restarts.subscribe()
    }

    /// Forgets all history, as an etcd compaction: older watches and lists get 410 Gone.
    pub fn compact(&self) {
        self.store().compact();
        tracing::info!("history compacted");
    }

    /// Closes every open watch, as an apiserver restart would.
    pub fn drop_watches(&self) {
        self.inner.restarts.send_modify(|n| *n += 1);
        tracing::info!("all watches dropped");
    }

    /// Delays every API request by this much (zero turns it off).
    pub fn set_latency(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.inner.latency_us.store(micros, Ordering::Relaxed);
    }

    /// The added request latency.
    pub fn latency(&self) -> Duration {
        Duration::from_micros(self.inner.latency_us.load(Ordering::Relaxed))
    }

    // --- Control API for pods: what the scheduler and kubelet would do. ---

    /// Creates a pod as given, status included (namespace from its metadata, else `default`).
    pub fn create_pod(&self, pod: Value) -> Result<Value, ApiError> {
        let namespace = pod
            .get("metadata")
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned();
        self.create(Resource::Pods, &namespace, pod, false)?.value()
    }

    /// The pod's current JSON, or 404.
    pub fn pod(&self, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.get(&Key::new(Resource::Pods, namespace, name))?
            .value()
    }

    /// Changes a pod freely, as the kubelet or a controller would.
    pub fn modify_pod(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Result<Value, ApiError> {
        self.modify(&Key::new(Resource::Pods, namespace, name), change)?
            .value()
    }

    /// Where the kubelet keeps pod logs (`pods/log` reads from there).
    pub(crate) fn attach_pod_logs(&self, root: PathBuf) {
        let _ = self.inner.pod_logs.set(root);
    }

    /// A container's log (`GET pods/<name>/log`): the first container's when `container` is
    /// `None`; 400 for a pod no node has run, as the real server says.
    pub fn pod_log(
        &self,
        namespace: &str,
        name: &str,
        container: Option<&str>,
    ) -> Result<Vec<u8>, ApiError> {
        let pod = self.pod(namespace, name)?;
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        let root = self.inner.pod_logs.get().filter(|_| !node.is_empty());
        let Some(root) = root else {
            return Err(ApiError::bad_request(format!(
                "pod {name} does not have a host assigned"
            )));
        };
        let first = pod["spec"]["containers"][0]["name"]
            .as_str()
            .unwrap_or_default();
        let container = container.filter(|c| !c.is_empty()).unwrap_or(first);
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let path = log_path(root, namespace, name, uid, container);
        match std::fs::read(&path) {
            Ok(log) => Ok(log),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(error) => Err(ApiError::new(
                Reason::InternalError,
                format!("reading the log of {namespace}/{name}: {error}"),
            )),
        }
    }

    /// Sets `status.phase`.
    pub fn set_phase(&self, namespace: &str, name: &str, phase: &str) -> Result<Value, ApiError> {
        self.modify_pod(namespace, name, |pod| {
            ensure_object(pod, "status")["phase"] = json!(phase);
        })
    }

    /// Sets one container's state, in `initContainerStatuses` if it is an init container.
    pub fn set_container_state(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        state: ContainerState,
    ) -> Result<Value, ApiError> {
        self.modify_pod(namespace, name, |pod| {
            set_container(pod, container, &state);
        })
    }

    /// Sets (`Some`) or removes (`None`) a label.
    pub fn relabel(
        &self,
        namespace: &str,
        name: &str,
        label: &str,
        value: Option<&str>,
    ) -> Result<Value, ApiError> {
        self.modify_pod(namespace, name, |pod| {
            set_entry(pod, "labels", label, value)
        })
    }

    /// Sets (`Some`) or removes (`None`) an annotation.
    pub fn annotate(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<Value, ApiError> {
        self.modify_pod(namespace, name, |pod| {
            set_entry(pod, "annotations", key, value)
        })
    }

    /// Deletes a pod with the given grace period (the pod's own when `None`).
    pub fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        grace_period_seconds: Option<u64>,
    ) -> Result<Deletion, ApiError> {
        let options = DeleteOptions {
            grace_period_seconds,
            ..DeleteOptions::default()
        };
        self.delete(&Key::new(Resource::Pods, namespace, name), &options)
    }
}

fn conflict(key: &Key) -> ApiError {
    ApiError::conflict(
        key.resource.group(),
        key.resource.plural(),
        &key.name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

/// A pod's own grace period, 0 once it finished (the kubelet has nothing left to stop).
fn default_grace(resource: Resource, value: &Value) -> u64 {
    if resource != Resource::Pods {
        return 0;
    }
    let phase = value
        .get("status")
        .and_then(|s| s.get("phase"))
        .and_then(Value::as_str);
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return 0;
    }
    value
        .get("spec")
        .and_then(|s| s.get("terminationGracePeriodSeconds"))
        .and_then(Value::as_u64)
        .unwrap_or(30)
}

fn requested_revision(store: &Store, query: &ListQuery) -> Result<u64, ApiError> {
    let head = store.head();
    let Some(requested) = query
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty() && *rv != "0")
    else {
        return Ok(head);
    };
    let rv: u64 = requested
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {requested:?}")))?;
    if rv > head {
        return Err(ApiError::new(
            Reason::Timeout,
            format!("Too large resource version: {rv}, current: {head}"),
        ));
    }
    if query.resource_version_match == Some(ResourceVersionMatch::Exact) {
        Ok(rv)
    } else {
        // NotOlderThan: the newest state is never older than what was asked.
        Ok(head)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

fn encode_continue(rv: u64, last: &Key) -> String {
    let token = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: format!("{}/{}", last.namespace, last.name),
    };
    let json = serde_json::to_vec(&token).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

fn decode_continue(resource: Resource, token: &str) -> Result<(u64, Key), ApiError> {
    let bad = || ApiError::bad_request(format!("invalid continue token {token:?}"));
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let token: ContinueToken = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let (namespace, name) = token.start.split_once('/').ok_or_else(bad)?;
    Ok((token.rv, Key::new(resource, namespace, name)))
}

fn ensure_object<'a>(value: &'a mut Value, field: &str) -> &'a mut Value {
    if !value.is_object() {
        *value = json!({});
    }
    let slot = &mut value[field];
    if !slot.is_object() {
        *slot = json!({});
    }
    slot
}

fn set_entry(pod: &mut Value, map: &str, key: &str, value: Option<&str>) {
    let meta = ensure_object(pod, "metadata");
    let entries = ensure_object(meta, map);
    if let Some(entries) = entries.as_object_mut() {
        match value {
            Some(v) => entries.insert(key.to_owned(), json!(v)),
            None => entries.remove(key),
        };
    }
}

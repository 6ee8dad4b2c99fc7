//! What the kubelet asks of the API server it serves: the simulator's [`Cluster`] in process,
//! or any Kubernetes API server through the kube client (`podstream kubelet`). Either way it
//! sees pods as JSON: a full list to start from (and after a `410`), then their changes.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Binding, Node as NodeObject, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::PodId;
use crate::cluster::{Cluster, DeleteOptions};
use crate::object::Key;
use crate::resource::Resource;
use crate::selector::Filter;
use crate::store::Change;

/// What the kubelet learns of the pods.
pub(super) enum Observed {
    /// Every pod as it is now: a start, or a new start after history was lost.
    Resync(Vec<Value>),
    /// One pod changed.
    Change(Change, Value),
}

/// The API server a kubelet serves.
#[derive(Clone)]
pub(super) enum NodeApi {
    /// The simulator, in process.
    Simulated(Cluster),
    /// A Kubernetes API server: the pods of one namespace, or of all.
    Remote(kube::Client, Option<String>),
}

/// Attempts at a status write that loses a race with another writer.
const CONFLICT_RETRIES: usize = 5;

impl NodeApi {
    /// Sends what the kubelet must learn of the pods to `changes`, until it is dropped.
    pub(super) async fn follow(self, changes: mpsc::UnboundedSender<Observed>) {
        match self {
            NodeApi::Simulated(cluster) => follow_cluster(&cluster, &changes).await,
            NodeApi::Remote(client, namespace) => {
                follow_remote(client, namespace.as_deref(), &changes).await;
            }
        }
    }

    /// The pod now, if it is still the one `id` names.
    pub(super) async fn pod(&self, id: &PodId) -> Option<Value> {
        let pod = match self {
            NodeApi::Simulated(cluster) => cluster.pod(&id.namespace, &id.name).ok()?,
            NodeApi::Remote(client, _) => {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &id.namespace);
                serde_json::to_value(pods.get_opt(&id.name).await.ok()??).ok()?
            }
        };
        (super::id_of(&pod) == *id).then_some(pod)
    }

    /// Binds the pod to `node` (a real API server takes `spec.nodeName` only through the
    /// binding subresource; the simulator's status writes set it). False when refused.
    pub(super) async fn bind(&self, id: &PodId, node: &str) -> bool {
        let NodeApi::Remote(client, _) = self else {
            return true;
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &id.namespace);
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(id.name.clone()),
                uid: Some(id.uid.clone()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                kind: Some("Node".into()),
                name: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        };
        let bound: Result<Value, _> = pods
            .create_subresource("binding", &id.name, &PostParams::default(), &binding)
            .await;
        if let Err(error) = &bound {
            tracing::info!(pod = %id.name, namespace = %id.namespace, %error, "binding refused");
        }
        bound.is_ok()
    }

    /// Writes the pod's status as `change` makes it, if it is still the pod `id` names.
    pub(super) async fn write_status(&self, id: &PodId, change: impl Fn(&mut Value)) {
        match self {
            NodeApi::Simulated(cluster) => {
                let result = cluster.modify_pod(&id.namespace, &id.name, |pod| {
                    if super::id_of(pod) == *id {
                        change(pod);
                    }
                });
                if let Err(error) = result {
                    tracing::debug!(pod = %id.name, namespace = %id.namespace, %error, "kubelet status write refused");
                }
            }
            NodeApi::Remote(client, _) => {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &id.namespace);
                for _ in 0..CONFLICT_RETRIES {
                    let Some(mut pod) = self.pod(id).await else {
                        return;
                    };
                    change(&mut pod);
                    let pod: Pod = match serde_json::from_value(pod) {
                        Ok(pod) => pod,
                        Err(error) => {
                            tracing::warn!(pod = %id.name, %error, "kubelet status is not a pod");
                            return;
                        }
                    };
                    match pods
                        .replace_status(&id.name, &PostParams::default(), &pod)
                        .await
                    {
                        Ok(_) => return,
                        Err(kube::Error::Api(status)) if status.code == 409 => {}
                        Err(error) => {
                            tracing::debug!(pod = %id.name, namespace = %id.namespace, %error, "kubelet status write refused");
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Deletes the pod with grace 0, as a kubelet does once its containers are gone; only the
    /// pod `id` names (a uid precondition), never one re-created under its name.
    pub(super) async fn remove(&self, id: &PodId) {
        let refused = match self {
            NodeApi::Simulated(cluster) => {
                let options = DeleteOptions {
                    grace_period_seconds: Some(0),
                    uid: Some(id.uid.clone()),
                    ..DeleteOptions::default()
                };
                let key = Key::new(Resource::Pods, &id.namespace, &id.name);
                cluster.delete(&key, &options).err().map(|e| e.to_string())
            }
            NodeApi::Remote(client, _) => {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &id.namespace);
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(id.uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                pods.delete(&id.name, &params)
                    .await
                    .err()
                    .map(|e| e.to_string())
            }
        };
        if let Some(error) = refused {
            tracing::debug!(pod = %id.name, %error, "kubelet's final delete refused");
        }
    }
}

/// The simulator's pods: its change log, from a list, again after a compaction.
async fn follow_cluster(cluster: &Cluster, changes: &mpsc::UnboundedSender<Observed>) {
    let mut head = cluster.subscribe();
    let resync = || {
        let (current, rv) = cluster.current(Resource::Pods, &Filter::default());
        let pods = current.iter().filter_map(|s| s.value().ok()).collect();
        (Observed::Resync(pods), rv)
    };
    let (first, mut rv) = resync();
    if changes.send(first).is_err() {
        return;
    }
    loop {
        loop {
            let Ok(events) = cluster.events_after(rv, 1024) else {
                // History compacted under us (410): start again from the pods as they are.
                let (again, at) = resync();
                rv = at;
                if changes.send(again).is_err() {
                    return;
                }
                continue;
            };
            let Some(last) = events.last() else { break };
            rv = last.rv;
            for event in events
                .iter()
                .filter(|e| e.object.key.resource == Resource::Pods)
            {
                if let Ok(pod) = event.object.value()
                    && changes.send(Observed::Change(event.change, pod)).is_err()
                {
                    return;
                }
            }
        }
        if head.changed().await.is_err() {
            return;
        }
    }
}

/// A real API server's pods: kube-runtime's watcher (list, watch, relist after a `410`).
async fn follow_remote(
    client: kube::Client,
    namespace: Option<&str>,
    changes: &mpsc::UnboundedSender<Observed>,
) {
    let pods: Api<Pod> = match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let mut events = watcher(pods, watcher::Config::default()).boxed();
    let mut listing: Vec<Value> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let uid = |pod: &Value| {
        pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    while let Some(event) = events.next().await {
        let observed = match event {
            Ok(watcher::Event::Init) => {
                listing.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(pod)) => {
                listing.extend(serde_json::to_value(pod).ok());
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                seen = listing.iter().map(uid).collect();
                Observed::Resync(std::mem::take(&mut listing))
            }
            Ok(watcher::Event::Apply(pod)) => {
                let Ok(pod) = serde_json::to_value(pod) else {
                    continue;
                };
                let change = if seen.insert(uid(&pod)) {
                    Change::Added
                } else {
                    Change::Modified
                };
                Observed::Change(change, pod)
            }
            Ok(watcher::Event::Delete(pod)) => {
                let Ok(pod) = serde_json::to_value(pod) else {
                    continue;
                };
                seen.remove(&uid(&pod));
                Observed::Change(Change::Deleted, pod)
            }
            Err(error) => {
                tracing::warn!(%error, "the kubelet's pod watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if changes.send(observed).is_err() {
            return;
        }
    }
}

/// How often the node's Lease is renewed (a real kubelet's default).
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Registers `node` (its address, Ready) on a real API server, then renews its Lease in
/// `kube-node-lease` until dropped.
pub(super) async fn register_node(client: kube::Client, name: String, ip: String) {
    let nodes: Api<NodeObject> = Api::all(client.clone());
    let node = NodeObject {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([("kubernetes.io/hostname".to_owned(), name.clone())].into()),
            ..ObjectMeta::default()
        },
        ..NodeObject::default()
    };
    if let Err(error) = nodes.create(&PostParams::default(), &node).await {
        tracing::debug!(%error, node = %name, "creating the Node");
    }
    let now = jiff::Timestamp::now().to_string();
    let status = json!({ "status": {
        "addresses": [{ "type": "InternalIP", "address": ip }, { "type": "Hostname", "address": name }],
        "capacity": { "pods": "110", "cpu": "2", "memory": "8Gi" },
        "allocatable": { "pods": "110", "cpu": "2", "memory": "8Gi" },
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "podstream's simulated kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    }});
    if let Err(error) = nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        tracing::warn!(%error, node = %name, "the Node's status was refused");
    }
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tick.tick().await;
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.clone()),
                lease_duration_seconds: Some(40),
                renew_time: Some(MicroTime(jiff::Timestamp::now())),
                ..LeaseSpec::default()
            }),
        };
        let params = PatchParams::apply("podstream-kubelet").force();
        if let Err(error) = leases.patch(&name, &params, &Patch::Apply(&lease)).await {
            tracing::warn!(%error, node = %name, "the node's heartbeat was refused");
        }
    }
}

//! podstream against a real Kubernetes control plane: the kube-apiserver and etcd that
//! `scripts/setup.sh` builds from their Go modules, with RBAC and admission on. Each test takes
//! a namespace of its own on the control plane this test process shares.
//!
//! The ingest's watch: every (uid, resourceVersion) once on its owner's subject, a restart
//! after etcd compacted its history (`410 Gone`, a relist, synthesized deletes), and a list of
//! ten thousand pods in pages; three ingests electing one through a real Lease while leaders
//! are killed and paused.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use podstream_bus::BusConfig;
use podstream_ingest::service::IngestConfig;
use podstream_proto::subject::{Subjects, stream_names};
use podstream_proto::v1::EventType;
use podstream_sim::WorkerPod;
use podstream_tests::bus;
use podstream_tests::control_plane::{ControlPlane, Options};
use podstream_tests::ingest::InProcessIngest as Ingest;
use podstream_tests::nats::NatsServer;
use serde_json::json;

const PODS: &str = stream_names::PODS;

/// A kube client for `kubeconfig`.
async fn client(kubeconfig: &Path) -> kube::Client {
    podstream_tests::kube_client_of(&std::fs::read_to_string(kubeconfig).unwrap()).await
}

async fn start_ingest(plane: &ControlPlane, namespace: &str, nats: &str) -> Ingest {
    let config = IngestConfig {
        bus: BusConfig::at(nats),
        namespaces: vec![namespace.to_owned()],
        checkpoint_interval: Duration::from_millis(50),
        ..IngestConfig::default()
    };
    Ingest::start(config, client(plane.admin_kubeconfig()).await)
}

/// What the API server said a pod is at one revision, with its owner then.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Fact {
    uid: String,
    rv: u64,
    owner: String,
}

fn fact(pod: &Pod) -> Fact {
    Fact {
        uid: pod.metadata.uid.clone().unwrap(),
        rv: pod
            .metadata
            .resource_version
            .as_ref()
            .unwrap()
            .parse()
            .unwrap(),
        owner: pod.metadata.labels.as_ref().unwrap()["airflow-worker"].clone(),
    }
}

/// Drives pods through the real API server, as Airflow and a kubelet would, and records what
/// it answered: every revision written, every relabel, every pod deleted.
struct Scenario {
    pods: Api<Pod>,
    namespace: String,
    facts: Vec<Fact>,
    relabels: usize,
    /// Per deleted pod's uid: its last written revision, and its delete's.
    deleted: HashMap<String, (u64, u64)>,
    /// Each pod's uid by name.
    pods_named: HashMap<String, String>,
}

impl Scenario {
    fn new(kube: kube::Client, namespace: &str) -> Scenario {
        Scenario {
            pods: Api::namespaced(kube, namespace),
            namespace: namespace.to_owned(),
            facts: Vec::new(),
            relabels: 0,
            deleted: HashMap::new(),
            pods_named: HashMap::new(),
        }
    }

    fn worker_pod(&self, name: &str, owner: &str) -> Pod {
        let mut pod = WorkerPod::new(
            name,
            owner,
            "etl",
            name,
            "scheduled__2026-11-30T10:00:00+00:00",
        );
        pod.namespace.clone_from(&self.namespace);
        serde_json::from_value(pod.to_json()).unwrap()
    }

    async fn create(&mut self, name: &str, owner: &str) {
        let pod = self.worker_pod(name, owner);
        let created = self
            .pods
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let created = fact(&created);
        self.pods_named.insert(name.to_owned(), created.uid.clone());
        self.facts.push(created);
    }

    /// Writes the phase through the status subresource, as a kubelet does.
    async fn phase(&mut self, name: &str, phase: &str) {
        let patch = Patch::Merge(json!({ "status": { "phase": phase } }));
        let pod = self
            .pods
            .patch_status(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
        self.facts.push(fact(&pod));
    }

    async fn relabel(&mut self, name: &str, owner: &str) {
        let patch = Patch::Merge(json!({ "metadata": { "labels": { "airflow-worker": owner } } }));
        let pod = self
            .pods
            .patch(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
        self.relabels += 1;
        self.facts.push(fact(&pod));
    }

    /// Deletes at once (grace 0). The API server first writes the pod with its deletion
    /// timestamp (a revision of its own, seen only by the watch), then removes it at the
    /// revision it answers with.
    async fn delete(&mut self, name: &str) {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let last_written = self
            .facts
            .iter()
            .rev()
            .find(|f| self.pods_named.get(name).is_some_and(|uid| *uid == f.uid));
        let last_written = last_written.map_or(0, |f| f.rv);
        let answer = self.pods.delete(name, &params).await.unwrap();
        let gone = answer.left().expect("the API server answers with the pod");
        let gone = fact(&gone);
        self.deleted.insert(gone.uid, (last_written, gone.rv));
    }

    /// Step `step` of pod `i`'s life: create, run, maybe relabel, end, maybe delete.
    async fn step(&mut self, i: usize, step: usize) {
        let name = format!("pod-{i:04}");
        match step {
            0 => self.create(&name, &(1 + i % 3).to_string()).await,
            1 => self.phase(&name, "Running").await,
            2 if i.is_multiple_of(10) => {
                self.relabel(&name, &(1 + (i + 1) % 3).to_string()).await;
            }
            3 => {
                let phase = if i.is_multiple_of(2) {
                    "Succeeded"
                } else {
                    "Failed"
                };
                self.phase(&name, phase).await;
            }
            4 if i.is_multiple_of(5) => self.delete(&name).await,
            _ => {}
        }
    }

    /// Messages the stream must hold: an event per revision, two per delete (the deletion
    /// timestamp's revision and the delete), a notice per relabel.
    fn expected(&self) -> u64 {
        (self.facts.len() + 2 * self.deleted.len() + self.relabels) as u64
    }
}

/// One stored pod event.
#[derive(Debug)]
struct Event {
    fact: Fact,
    deleted: bool,
    synthesized: bool,
}

/// The stream's events in order (owner notices left out), each checked to be on its owner's
/// subject and its pod's.
fn events(stored: &[bus::Stored]) -> Vec<Event> {
    let subjects = Subjects::new("podstream").unwrap();
    stored
        .iter()
        .filter(|m| m.header("Podstream-Role") == Some("event"))
        .map(|message| {
            let event = message.pod_event();
            let pod = event.pod.as_ref().unwrap();
            let (owner, uid) = subjects.parse(&message.subject).unwrap();
            assert_eq!(uid, pod.uid, "the subject names the pod");
            assert_eq!(owner, event.owner, "an event goes on its owner's subject");
            Event {
                fact: Fact {
                    uid: pod.uid.clone(),
                    rv: event.resource_version.parse().unwrap(),
                    owner: event.owner.clone(),
                },
                deleted: event.r#type() == EventType::Deleted,
                synthesized: event.synthesized,
            }
        })
        .collect()
}

/// Every written revision once; every deleted pod's deletion-timestamp revision and delete
/// once, in that order after its last written revision; each pod's events in revision order.
fn assert_exactly(events: &[Event], scenario: &Scenario) {
    let facts: HashSet<&Fact> = scenario.facts.iter().collect();
    let (written, unwritten): (Vec<&Event>, Vec<&Event>) = events
        .iter()
        .filter(|e| !e.deleted)
        .partition(|e| facts.contains(&e.fact));
    let got: HashSet<&Fact> = written.iter().map(|e| &e.fact).collect();
    assert_eq!(got.len(), written.len(), "no revision twice");
    let missing: Vec<&Fact> = scenario
        .facts
        .iter()
        .filter(|f| !got.contains(f))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "revisions missing, e.g. {missing:?}");

    let deletes: Vec<&Event> = events.iter().filter(|e| e.deleted).collect();
    assert_eq!(
        deletes.len(),
        scenario.deleted.len(),
        "one delete per deleted pod"
    );
    assert_eq!(
        unwritten.len(),
        scenario.deleted.len(),
        "one deletion timestamp per deleted pod"
    );
    for delete in deletes {
        let (_, rv) = scenario
            .deleted
            .get(&delete.fact.uid)
            .expect("a deleted pod");
        assert_eq!(delete.fact.rv, *rv, "{delete:?}: the delete's own revision");
    }
    for marked in unwritten {
        let (last, rv) = scenario
            .deleted
            .get(&marked.fact.uid)
            .expect("a deleted pod");
        assert!(
            (*last + 1..*rv).contains(&marked.fact.rv),
            "{marked:?}: the deletion timestamp's revision, between {last} and {rv}"
        );
    }
    let mut last: HashMap<&str, u64> = HashMap::new();
    for event in events {
        if let Some(before) = last.insert(&event.fact.uid, event.fact.rv) {
            assert!(
                event.fact.rv > before,
                "{event:?} came after revision {before}"
            );
        }
    }
}

/// A nats-server, a JetStream client, a namespace of the shared control plane and an admin
/// client for it.
async fn rig(
    prefix: &str,
) -> (
    NatsServer,
    jetstream::Context,
    &'static ControlPlane,
    String,
) {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let plane = tokio::task::spawn_blocking(ControlPlane::shared)
        .await
        .unwrap();
    let namespace = plane.namespace(prefix);
    (nats, js, plane, namespace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_revision_once_on_its_owners_subject() {
    let (nats, js, plane, namespace) = rig("revisions").await;
    let mut scenario = Scenario::new(client(plane.admin_kubeconfig()).await, &namespace);
    let ingest = start_ingest(plane, &namespace, &nats.url()).await;
    // Listed first: the sentinel reaches the stream once the watch runs.
    scenario.create("sentinel", "0").await;
    bus::settle(&js, PODS, 1, Duration::ZERO, Duration::from_secs(60)).await;
    for step in 0..5 {
        for i in 0..60 {
            scenario.step(i, step).await;
        }
    }
    bus::settle(
        &js,
        PODS,
        scenario.expected(),
        Duration::from_millis(1500),
        Duration::from_secs(60),
    )
    .await;
    let stats = ingest.stop().await;
    let stored = bus::read_all(&js, PODS).await;
    let events = events(&stored);
    assert_exactly(&events, &scenario);
    assert!(
        events.iter().all(|e| !e.synthesized),
        "the watch saw every delete"
    );
    assert_eq!(stats.synthesized, 0);
    assert_eq!(stored.len() as u64, scenario.expected(), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_etcd_compacted_its_history_relists_and_loses_nothing() {
    // A watch cache would still hold the checkpoint's revision after this short a pause; off,
    // the watch reads etcd's compacted history, as a cluster's does after a long one.
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let plane = tokio::task::spawn_blocking(|| ControlPlane::start(Options { watch_cache: false }))
        .await
        .unwrap();
    let plane = &plane;
    let namespace = plane.namespace("compacted");
    let mut scenario = Scenario::new(client(plane.admin_kubeconfig()).await, &namespace);
    let ingest = start_ingest(plane, &namespace, &nats.url()).await;
    scenario.create("sentinel", "0").await;
    bus::settle(&js, PODS, 1, Duration::ZERO, Duration::from_secs(60)).await;
    for i in 0..20 {
        scenario.step(i, 0).await;
        scenario.step(i, 1).await;
    }
    bus::settle(
        &js,
        PODS,
        41,
        Duration::from_millis(500),
        Duration::from_secs(60),
    )
    .await;
    ingest.stop().await;

    // While it is down: some pods finish, some vanish, one appears; then etcd compacts.
    for i in 0..5 {
        scenario.phase(&format!("pod-{i:04}"), "Failed").await;
    }
    for i in 5..10 {
        scenario.delete(&format!("pod-{i:04}")).await;
    }
    scenario.create("pod-late", "2").await;
    plane.compact();

    let ingest = start_ingest(plane, &namespace, &nats.url()).await;
    bus::settle(
        &js,
        PODS,
        41 + 11,
        Duration::from_millis(1500),
        Duration::from_secs(60),
    )
    .await;
    let stats = ingest.stop().await;
    let events = events(&bus::read_all(&js, PODS).await);
    let tail = &events[41..];
    assert_eq!(
        tail.len(),
        11,
        "5 failures, 5 deletes, 1 new pod: {tail:#?}"
    );
    let synthesized: Vec<&Event> = tail.iter().filter(|e| e.synthesized).collect();
    assert_eq!(
        synthesized.len(),
        5,
        "the deletes no watch saw are synthesized: {tail:#?}"
    );
    assert!(synthesized.iter().all(|e| e.deleted));
    assert_eq!(stats.synthesized, 5);
    // The failures arrive at their latest revision.
    for fact in &scenario.facts[41..46] {
        assert!(tail.iter().any(|e| &e.fact == fact), "{fact:?} published");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pods_are_listed_in_pages_each_once() {
    const N: usize = 10_000;
    let (nats, js, plane, namespace) = rig("paged").await;
    let kube = client(plane.admin_kubeconfig()).await;
    let scenario = Scenario::new(kube.clone(), &namespace);
    let pods: Vec<Pod> = (0..N)
        .map(|i| scenario.worker_pod(&format!("pod-{i:05}"), &(1 + i % 4).to_string()))
        .collect();
    let api = scenario.pods.clone();
    let started = Instant::now();
    // Created eight at a time: the API server's rate, not the test's round trips, bounds it.
    let created: Vec<Pod> = futures::stream::iter(pods)
        .map(|pod| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pod).await.unwrap() }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    eprintln!("created {N} pods in {:?}", started.elapsed());
    // The API server pages this list: a page of 500 ends with a continue token.
    let page = api.list(&ListParams::default().limit(500)).await.unwrap();
    assert_eq!(page.items.len(), 500);
    assert!(
        page.metadata.continue_.is_some(),
        "the API server pages the list"
    );

    let started = Instant::now();
    let ingest = start_ingest(plane, &namespace, &nats.url()).await;
    bus::settle(
        &js,
        PODS,
        N as u64,
        Duration::from_secs(2),
        Duration::from_secs(240),
    )
    .await;
    eprintln!("listed and published {N} pods in {:?}", started.elapsed());
    let stats = ingest.stop().await;
    let events = events(&bus::read_all(&js, PODS).await);
    let want: HashSet<Fact> = created.iter().map(fact).collect();
    let got: HashSet<Fact> = events.iter().map(|e| e.fact.clone()).collect();
    assert_eq!(events.len(), N, "each pod once: {stats}");
    assert_eq!(got, want, "each pod at the revision it was created at");
}

/// Who holds the namespace's `podstream-ingest` Lease now.
async fn lease_holder(kube: &kube::Client, namespace: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(kube.clone(), namespace);
    leases
        .get_opt("podstream-ingest")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

/// Three `podstream ingest` processes elect a leader through a real Lease; the leader is
/// killed (-9) twice and paused (SIGSTOP) once while pods churn: each time another takes over,
/// the woken one exits deposed, and the stream holds every revision once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ingests_on_a_real_lease_one_leader_killed_and_paused_every_change_once() {
    use podstream_tests::component::Component;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Fault {
        Kill,
        Pause,
    }

    let (nats, js, plane, namespace) = rig("leader").await;
    let kube = client(plane.admin_kubeconfig()).await;
    let url = nats.url();
    let names = ["ingest-a", "ingest-b", "ingest-c"];
    let mut ingests: Vec<Component> = names
        .iter()
        .map(|name| {
            Component::start_with_env(
                podstream_tests::podstream_binary(),
                &[
                    "ingest",
                    "--nats",
                    &url,
                    "--namespaces",
                    &namespace,
                    "--lease-namespace",
                    &namespace,
                    "--checkpoint-interval-ms",
                    "200",
                ],
                plane.admin_kubeconfig(),
                &[("POD_NAME", name)],
            )
        })
        .collect();
    let mut scenario = Scenario::new(kube.clone(), &namespace);
    scenario.create("sentinel", "0").await;
    bus::settle(&js, PODS, 1, Duration::ZERO, Duration::from_secs(60)).await;
    let leader = |holder: Option<String>| -> Option<usize> {
        let holder = holder?;
        names
            .iter()
            .position(|name| holder.starts_with(&format!("{name}_")))
    };

    let pods = 300;
    let mut order: Vec<(usize, usize)> = (0..5)
        .flat_map(|s| (0..pods).map(move |i| (i, s)))
        .collect();
    order.sort_by_key(|&(i, s)| (s * pods + (i * 7919) % pods, i));
    let mut steps = order.into_iter();
    let mut faults = vec![Fault::Kill, Fault::Kill, Fault::Pause].into_iter();
    let mut next_fault_at = Instant::now() + Duration::from_secs(3);
    let mut pending: Option<(Fault, usize, Instant)> = None;
    let mut takeovers = Vec::new();
    let mut paused_exit = None;
    loop {
        if let Some((i, s)) = steps.next() {
            scenario.step(i, s).await;
        } else {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let now = Instant::now();
        match pending {
            None if now >= next_fault_at => match faults.next() {
                Some(fault) => {
                    let current = leader(lease_holder(&kube, &namespace).await)
                        .expect("a leader holds the lease");
                    match fault {
                        Fault::Kill => ingests[current].kill(),
                        Fault::Pause => ingests[current].signal("STOP"),
                    }
                    pending = Some((fault, current, now));
                }
                None if paused_exit.is_some() => break,
                None => {}
            },
            Some((fault, old, at)) => {
                let holder = leader(lease_holder(&kube, &namespace).await);
                if let Some(new) = holder.filter(|&new| new != old) {
                    let took = at.elapsed();
                    takeovers.push(took);
                    eprintln!(
                        "{fault:?} of {}: {} took over in {took:?}",
                        names[old], names[new]
                    );
                    match fault {
                        Fault::Kill => ingests[old].restart(),
                        Fault::Pause => {
                            ingests[old].signal("CONT");
                            paused_exit = Some(ingests[old].wait_exit(Duration::from_secs(15)));
                            ingests[old].restart();
                        }
                    }
                    pending = None;
                    next_fault_at = Instant::now() + Duration::from_secs(3);
                } else {
                    assert!(
                        at.elapsed() < Duration::from_secs(30),
                        "no takeover 30 s after the {fault:?} of {}",
                        names[old]
                    );
                }
            }
            _ => {}
        }
    }
    for (i, s) in steps {
        scenario.step(i, s).await;
    }
    bus::settle(
        &js,
        PODS,
        scenario.expected(),
        Duration::from_millis(1500),
        Duration::from_secs(90),
    )
    .await;
    let stored = bus::read_all(&js, PODS).await;
    assert_exactly(&events(&stored), &scenario);
    assert_eq!(stored.len() as u64, scenario.expected());
    assert_eq!(takeovers.len(), 3);
    for took in &takeovers {
        assert!(*took <= Duration::from_secs(15), "takeovers: {takeovers:?}");
    }
    let woken = paused_exit.flatten().expect("the woken old leader exits");
    assert!(
        !woken.success(),
        "a deposed leader exits with an error: {woken:?}"
    );
    for ingest in ingests {
        ingest.terminate();
    }
}

/// A pod's phase, and its first container's terminated exit code and reason, as the API server
/// has them.
async fn outcome(pods: &Api<Pod>, name: &str) -> Option<(String, Option<(i32, String)>)> {
    let pod = pods.get_opt(name).await.unwrap()?;
    let status = pod.status?;
    let terminated = status
        .container_statuses
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.state?.terminated)
        .map(|t| (t.exit_code, t.reason.unwrap_or_default()));
    Some((status.phase.unwrap_or_default(), terminated))
}

/// `podstream kubelet` as a node of the real API server: it registers its Node and heartbeat
/// Lease, binds the pods that name no node, runs them, writes their status through the status
/// subresource (what the API server validates), and honours a graceful delete: SIGTERM, and
/// the pod goes once its process ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_runs_pods_on_the_real_api_server() {
    use k8s_openapi::api::core::v1::Node;

    let plane = tokio::task::spawn_blocking(ControlPlane::shared)
        .await
        .unwrap();
    let namespace = plane.namespace("node");
    let kube = client(plane.admin_kubeconfig()).await;
    let dir = tempfile::tempdir().unwrap();
    let _kubelet = podstream_tests::component::Component::start(
        podstream_tests::podstream_binary(),
        &[
            "kubelet",
            "--namespace",
            &namespace,
            "--dir",
            &dir.path().display().to_string(),
        ],
        plane.admin_kubeconfig(),
    );
    let pods: Api<Pod> = Api::namespaced(kube.clone(), &namespace);
    let pod = |name: &str, script: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                "containers": [{ "name": "base", "image": "none",
                    "command": ["sh", "-c", script] }] },
        }))
        .unwrap()
    };
    for (name, script) in [
        ("succeeds", "exit 0"),
        ("fails", "exit 3"),
        ("runs", "trap 'exit 0' TERM; while :; do sleep 0.1; done"),
    ] {
        pods.create(&PostParams::default(), &pod(name, script))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let succeeded = outcome(&pods, "succeeds").await;
        let failed = outcome(&pods, "fails").await;
        let running = outcome(&pods, "runs").await;
        if succeeded == Some(("Succeeded".into(), Some((0, "Completed".into()))))
            && failed == Some(("Failed".into(), Some((3, "Error".into()))))
            && running
                .as_ref()
                .is_some_and(|(phase, _)| phase == "Running")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{succeeded:?} {failed:?} {running:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let bound = pods.get("runs").await.unwrap();
    assert_eq!(
        bound.spec.unwrap().node_name.as_deref(),
        Some(podstream_sim::kubelet::NODE_NAME),
        "bound through the binding subresource"
    );

    // A graceful delete: the API server marks the pod, the kubelet stops its process and
    // confirms with the final delete.
    let started = Instant::now();
    pods.delete("runs", &DeleteParams::default()).await.unwrap();
    let marked = pods.get("runs").await.unwrap();
    assert!(
        marked.metadata.deletion_timestamp.is_some(),
        "held for the node"
    );
    while pods.get_opt("runs").await.unwrap().is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the kubelet never confirmed the delete"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let node = Api::<Node>::all(kube.clone())
        .get(podstream_sim::kubelet::NODE_NAME)
        .await
        .unwrap();
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "the node reports Ready");
    let heartbeat: Api<Lease> = Api::namespaced(kube, "kube-node-lease");
    let lease = heartbeat
        .get(podstream_sim::kubelet::NODE_NAME)
        .await
        .unwrap();
    assert!(lease.spec.and_then(|s| s.renew_time).is_some());
}

/// The collector's ServiceAccount: it may delete pods, and do nothing else.
fn collector_rbac(namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: podstream-collect\n  namespace: {namespace}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: podstream-collect\n  namespace: {namespace}\n\
         rules:\n- apiGroups: [\"\"]\n  resources: [pods]\n  verbs: [delete]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: podstream-collect\n  namespace: {namespace}\n\
         roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: podstream-collect\n\
         subjects:\n- kind: ServiceAccount\n  name: podstream-collect\n  namespace: {namespace}\n"
    )
}

/// The collector's DELETE requests so far, by pod, with the API server's answers, from the
/// audit log.
fn deletes_by(plane: &ControlPlane, namespace: &str) -> HashMap<String, Vec<u16>> {
    let user = format!("system:serviceaccount:{namespace}:podstream-collect");
    let mut deletes: HashMap<String, Vec<u16>> = HashMap::new();
    for request in plane.audit() {
        if request.user == user && request.verb == "delete" && request.resource == "pods" {
            deletes.entry(request.name).or_default().push(request.code);
        }
    }
    deletes
}

/// The collector on the real API server, as a ServiceAccount that may only delete pods, behind
/// a real ingest and processor: a pod that succeeded and one that failed are each deleted by
/// exactly one DELETE (no 404); seed 003's second pod, which failed while the first drove, is
/// deleted once after the grace period while the driving pod is never touched until its own
/// try ends; a live pod of a superseded try is deleted after the grace period; and a delete
/// on the preconditions of a pod since recreated under its name leaves the new pod alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_deletes_each_pod_once_and_never_one_that_drives() {
    use podstream_collector::rule::Settings;
    use podstream_collector::service::CollectConfig;
    use podstream_processor::service::ProcessConfig;

    let (nats, js, plane, namespace) = rig("collect").await;
    plane.apply(&collector_rbac(&namespace));
    let collector_kubeconfig = plane.service_account_kubeconfig(&namespace, "podstream-collect");
    let collector_kube = client(&collector_kubeconfig).await;
    let admin = client(plane.admin_kubeconfig()).await;
    let pods: Api<Pod> = Api::namespaced(admin, &namespace);

    // `tail` prints each pod collected as it happens.
    let mut tail = std::process::Command::new(podstream_tests::podstream_binary())
        .args(["tail", "--json", "--nats", &nats.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let tailed = tail.stdout.take().unwrap();
    let tailed = std::thread::spawn(move || {
        use std::io::BufRead as _;
        std::io::BufReader::new(tailed)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let ingest = start_ingest(plane, &namespace, &nats.url()).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let processor = tokio::spawn(podstream_processor::service::run(
        ProcessConfig {
            bus: BusConfig::at(&nats.url()),
            ..ProcessConfig::default()
        },
        until(),
    ));
    let grace = Duration::from_secs(3);
    let collector = tokio::spawn(podstream_collector::service::run(
        CollectConfig {
            bus: BusConfig::at(&nats.url()),
            settings: Settings {
                delete_worker_pods: true,
                delete_worker_pods_on_failure: true,
                grace,
                live_pods: true,
                // The namespace its Role covers, as the shipped Deployment gives it.
                namespaces: vec![namespace.clone()],
            },
            ..CollectConfig::default()
        },
        collector_kube.clone(),
        until(),
    ));

    let create = |name: &'static str, task: &'static str, try_number: u32| {
        let pods = pods.clone();
        let namespace = namespace.clone();
        async move {
            let mut pod = WorkerPod::new(name, "1", "etl", task, "manual__2026-12-06");
            pod.namespace = namespace;
            pod.try_number = try_number;
            let pod: Pod = serde_json::from_value(pod.to_json()).unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap()
        }
    };
    let phase = |name: &'static str, phase: &'static str| {
        let pods = pods.clone();
        async move {
            let patch = Patch::Merge(json!({ "status": { "phase": phase } }));
            pods.patch_status(name, &PatchParams::default(), &patch)
                .await
                .unwrap()
        }
    };
    let gone = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get_opt(name).await.unwrap().is_none() }
    };
    let wait_until_gone = |names: &'static [&'static str]| async move {
        let deadline = Instant::now() + Duration::from_secs(90);
        for name in names {
            while !gone(name).await {
                assert!(Instant::now() < deadline, "{name} was never deleted");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };

    for (name, task) in [
        ("ends-well", "ok"),
        ("ends-badly", "bad"),
        ("twin-a", "twins"),
        ("stale-1", "stale"),
    ] {
        create(name, task, 1).await;
        phase(name, "Running").await;
    }
    // Seed 003: a second pod for the running task, which fails.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create("twin-b", "twins", 1).await;
    phase("twin-b", "Failed").await;
    // Try 2 of `stale` runs while try 1's pod still does.
    create("stale-2", "stale", 2).await;
    phase("stale-2", "Running").await;
    phase("ends-well", "Succeeded").await;
    phase("ends-badly", "Failed").await;
    let started = Instant::now();
    wait_until_gone(&["ends-well", "ends-badly", "twin-b", "stale-1"]).await;
    assert!(
        started.elapsed() >= grace,
        "a loser and a stale pod wait out the grace period"
    );
    assert!(
        !gone("twin-a").await,
        "the pod that drives is never deleted"
    );
    assert!(!gone("stale-2").await, "the pod of the live try stays");

    // The driving pod's own try ends: it is deleted then, once.
    phase("twin-a", "Succeeded").await;
    wait_until_gone(&["twin-a"]).await;

    // A pod recreated under a deleted pod's name is another pod: the old one's preconditions
    // leave it alone.
    let old = create("recreated", "again", 1).await;
    pods.delete("recreated", &DeleteParams::default())
        .await
        .unwrap();
    wait_until_gone(&["recreated"]).await;
    let new = create("recreated", "again", 1).await;
    let old_ref = podstream_proto::v1::PodRef {
        namespace: namespace.clone(),
        name: "recreated".into(),
        uid: old.metadata.uid.clone().unwrap(),
    };
    let answer = podstream_collector::pods::delete(&collector_kube, &old_ref, None)
        .await
        .unwrap();
    assert_eq!(answer, podstream_collector::pods::Answer::Replaced);
    let new_ref = podstream_proto::v1::PodRef {
        uid: new.metadata.uid.clone().unwrap(),
        ..old_ref
    };
    let stale_version = old.metadata.resource_version.clone().unwrap();
    let answer = podstream_collector::pods::delete(&collector_kube, &new_ref, Some(&stale_version))
        .await
        .unwrap();
    assert_eq!(answer, podstream_collector::pods::Answer::Changed);
    assert!(!gone("recreated").await, "the recreated pod is left alone");

    // A message on a commands subject that is no command, and a command whose names are out
    // of bounds: each a dead letter of the collector, which goes on.
    let unbounded = podstream_proto::v1::Command {
        task: Some(podstream_proto::v1::TaskKey {
            dag_id: "d".repeat(300),
            try_number: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    for payload in [
        bytes::Bytes::from_static(b"\xff\xffnot protobuf"),
        prost::Message::encode_to_vec(&unbounded).into(),
    ] {
        js.publish("podstream.commands.1.garbage", payload)
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dead = bus::read_all(&js, stream_names::DEAD).await;
        let collector = dead
            .iter()
            .filter(|d| d.subject == "podstream.dead.collector")
            .count();
        if collector == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "dead letters: {collector}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let _ = stop.send(true);
    let stats = collector.await.unwrap().unwrap();
    processor.await.unwrap().unwrap();
    ingest.stop().await;

    // What `replay` and `tail` show of the collector: each pod once, with why.
    let replayed = std::process::Command::new(podstream_tests::podstream_binary())
        .args([
            "replay",
            "--since",
            "seq:1",
            "--json",
            "--nats",
            &nats.url(),
        ])
        .output()
        .unwrap();
    assert!(replayed.status.success(), "{replayed:?}");
    let _ = tail.kill();
    let _ = tail.wait();
    let tailed = tailed.join().unwrap();
    let expected = [
        ("ends-well", "finished", ""),
        ("ends-badly", "finished", ""),
        ("twin-b", "duplicate", "twin-a"),
        ("twin-a", "finished", ""),
        ("stale-1", "stale", "stale-2"),
    ];
    for (what, lines) in [
        (
            "replay",
            String::from_utf8_lossy(&replayed.stdout).into_owned(),
        ),
        ("tail", tailed.join("\n")),
    ] {
        let mut collected: Vec<(String, String, String)> = lines
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["stream"] == "collected")
            .map(|line| {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
                (
                    text(&line["pod"]["name"]),
                    text(&line["reason"]),
                    text(&line["driver"]["name"]),
                )
            })
            .collect();
        collected.sort();
        let mut wanted: Vec<(String, String, String)> = expected
            .iter()
            .map(|(p, r, d)| ((*p).to_owned(), (*r).to_owned(), (*d).to_owned()))
            .collect();
        wanted.sort();
        assert_eq!(collected, wanted, "{what} shows each pod collected once");
    }

    let deletes = deletes_by(plane, &namespace);
    let once = [200u16];
    for name in ["ends-well", "ends-badly", "twin-b", "twin-a", "stale-1"] {
        assert_eq!(
            deletes.get(name).map(Vec::as_slice),
            Some(&once[..]),
            "{name}: one DELETE, answered 200: {deletes:?}"
        );
    }
    assert_eq!(
        deletes.get("recreated").map(Vec::as_slice),
        Some(&[409u16, 409][..]),
        "{deletes:?}"
    );
    assert_eq!(deletes.len(), 6, "no other pod deleted: {deletes:?}");
    assert_eq!(stats.deleted, 5, "{stats}");
}

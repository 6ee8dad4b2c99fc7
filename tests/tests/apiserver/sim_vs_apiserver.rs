//! The simulator beside the real kube-apiserver: one sequence of requests (create, a conflict,
//! an invalid name, a missing pod, a label patch, a status write, selected lists, a graceful
//! delete of a bound pod and an immediate one of an unbound pod, a watch from a
//! resourceVersion) sent to both, the answers compared after masking what differs by nature
//! (uids, resourceVersions, times, the namespace's own uid).
//!
//! Every remaining difference is one of [`LISTED`], each of which `docs/sim.md` gives with its
//! reason: a new difference fails this test, and so does a listed one that is gone (fixed in
//! the simulator: then it leaves the list and the page).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use podstream_sim::{Server, SimConfig, WorkerPod};
use podstream_tests::control_plane::ControlPlane;
use podstream_tests::{kube_client_of, workspace_root};
use serde_json::{Value, json};

const NAMESPACE: &str = "differential";

/// The differences docs/sim.md lists, each with its reason: fields a real API server's defaults
/// and admission add that no podstream reader uses (kept out on purpose), and the deletion
/// rules the simulator does not match yet.
const LISTED: &[&str] = &[
    "pod .metadata.generation",
    "pod .metadata.managedFields",
    "pod .spec.containers[].volumeMounts",
    "pod .spec.enableServiceLinks",
    "pod .spec.preemptionPolicy",
    "pod .spec.priority",
    "pod .spec.securityContext",
    "pod .spec.serviceAccount",
    "pod .spec.tolerations",
    "pod .spec.volumes",
    "pod .metadata.deletionGracePeriodSeconds",
    "get unbound, gone: a pod on one server, an error on the other",
    "watch from the first revision:",
];

/// What a server answered to one request: the object (masked), or the error's code and reason.
fn answer<T: serde::Serialize>(result: Result<T, kube::Error>) -> Value {
    match result {
        Ok(object) => mask(serde_json::to_value(object).unwrap()),
        Err(kube::Error::Api(status)) => json!({ "code": status.code, "reason": status.reason }),
        Err(other) => json!({ "client error": other.to_string() }),
    }
}

/// Masks what differs by nature between two servers.
fn mask(mut value: Value) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, field) in map.iter_mut() {
                    match key.as_str() {
                        "uid" | "resourceVersion" | "creationTimestamp" | "deletionTimestamp"
                        | "startedAt" | "finishedAt" | "startTime" | "lastTransitionTime"
                        | "lastProbeTime" | "time" => {
                            if !field.is_null() {
                                *field = json!("<masked>");
                            }
                        }
                        _ => walk(field),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut value);
    value
}

/// The paths where `a` and `b` differ, array indices written `[]`.
fn differences(path: &str, a: &Value, b: &Value, out: &mut BTreeSet<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let null = Value::Null;
                differences(
                    &format!("{path}.{key}"),
                    x.get(key).unwrap_or(&null),
                    y.get(key).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (a, b) in x.iter().zip(y) {
                differences(&format!("{path}[]"), a, b, out);
            }
        }
        _ if a == b => {}
        _ => {
            out.insert(path.to_owned());
        }
    }
}

/// The sequence, played on one server; its answers by step name.
async fn play(kube: kube::Client) -> Vec<(&'static str, Value)> {
    let pods: Api<Pod> = Api::namespaced(kube, NAMESPACE);
    let worker = |name: &str| -> Pod {
        let mut pod = WorkerPod::new(name, "1", "etl", "extract", "manual__1");
        pod.namespace = NAMESPACE.to_owned();
        serde_json::from_value(pod.to_json()).unwrap()
    };
    let mut answers = Vec::new();
    let created = pods
        .create(&PostParams::default(), &worker("unbound"))
        .await;
    let from = created
        .as_ref()
        .ok()
        .and_then(|p| p.metadata.resource_version.clone())
        .unwrap_or_default();
    answers.push(("create", answer(created)));
    answers.push((
        "create again",
        answer(
            pods.create(&PostParams::default(), &worker("unbound"))
                .await,
        ),
    ));
    answers.push((
        "create an invalid name",
        answer(
            pods.create(&PostParams::default(), &worker("Not_A_Name"))
                .await,
        ),
    ));
    answers.push(("get a missing pod", answer(pods.get("missing").await)));
    let relabel = Patch::Merge(json!({ "metadata": { "labels": { "airflow-worker": "2" } } }));
    answers.push((
        "merge-patch a label",
        answer(
            pods.patch("unbound", &PatchParams::default(), &relabel)
                .await,
        ),
    ));
    let running = Patch::Merge(json!({ "status": { "phase": "Running" } }));
    answers.push((
        "patch the status",
        answer(
            pods.patch_status("unbound", &PatchParams::default(), &running)
                .await,
        ),
    ));
    let names = |list: Result<kube::core::ObjectList<Pod>, kube::Error>| match list {
        Ok(list) => json!(
            list.items
                .iter()
                .map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>()
        ),
        Err(error) => answer::<Value>(Err(error)),
    };
    answers.push((
        "list by label",
        names(
            pods.list(&ListParams::default().labels("airflow-worker=2"))
                .await,
        ),
    ));
    answers.push((
        "list by a label no pod has",
        names(
            pods.list(&ListParams::default().labels("airflow-worker=1"))
                .await,
        ),
    ));
    answers.push((
        "list by phase",
        names(
            pods.list(&ListParams::default().fields("status.phase=Running"))
                .await,
        ),
    ));

    // A pod on a node: a graceful delete waits for the node to confirm.
    let mut bound = worker("bound");
    bound.spec.as_mut().unwrap().node_name = Some("elsewhere".into());
    answers.push((
        "create bound",
        answer(pods.create(&PostParams::default(), &bound).await),
    ));
    let graceful = DeleteParams {
        grace_period_seconds: Some(30),
        ..DeleteParams::default()
    };
    answers.push((
        "delete bound, grace 30",
        answer(pods.delete("bound", &graceful).await.map(|e| e.left())),
    ));
    answers.push(("get bound, terminating", answer(pods.get("bound").await)));
    // An unbound pod goes at once, whatever the grace asked.
    answers.push((
        "delete unbound, grace 30",
        answer(pods.delete("unbound", &graceful).await.map(|e| e.left())),
    ));
    answers.push(("get unbound, gone", answer(pods.get("unbound").await)));

    // The watch from the first create's revision replays the sequence's changes.
    let params = WatchParams::default().timeout(2);
    let mut types = Vec::new();
    match pods.watch(&params, &from).await {
        Ok(stream) => {
            let mut stream = stream.boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                let (kind, pod) = match event {
                    WatchEvent::Added(pod) => ("ADDED", Some(pod)),
                    WatchEvent::Modified(pod) => ("MODIFIED", Some(pod)),
                    WatchEvent::Deleted(pod) => ("DELETED", Some(pod)),
                    WatchEvent::Bookmark(_) => continue,
                    WatchEvent::Error(status) => {
                        types.push(json!(format!("ERROR {}", status.code)));
                        break;
                    }
                };
                let name = pod.and_then(|p| p.metadata.name).unwrap_or_default();
                types.push(json!(format!("{kind} {name}")));
            }
        }
        Err(error) => types.push(answer::<Value>(Err(error))),
    }
    answers.push(("watch from the first revision", json!(types)));
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_answers_as_the_real_api_server_does() {
    let plane = tokio::task::spawn_blocking(ControlPlane::shared)
        .await
        .unwrap();
    plane.create_namespace(NAMESPACE);
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let sim = Server::start(
        addr,
        SimConfig {
            namespaces: vec![NAMESPACE.into()],
            bookmark_interval: Duration::from_secs(60),
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();

    let real =
        play(kube_client_of(&std::fs::read_to_string(plane.admin_kubeconfig()).unwrap()).await)
            .await;
    let simulated = play(kube_client_of(&sim.kubeconfig()).await).await;

    let mut found = BTreeSet::new();
    let mut report = String::new();
    for ((step, want), (_, got)) in real.iter().zip(&simulated) {
        let mut here = BTreeSet::new();
        let objects = (want.get("kind").is_some(), got.get("kind").is_some());
        match objects {
            // A pod either way: its fields, by path, whichever step returned it.
            (true, true) => differences("pod ", want, got, &mut here),
            (false, false) => {
                differences("", want, got, &mut here);
                here = here
                    .into_iter()
                    .map(|path| format!("{step}:{path}"))
                    .collect();
            }
            _ if want != got => {
                here.insert(format!(
                    "{step}: a pod on one server, an error on the other"
                ));
            }
            _ => {}
        }
        found.extend(here.iter().cloned());
        if !here.is_empty() {
            report.push_str(&format!(
                "\n== {step}\nreal: {want}\nsim:  {got}\n",
                want = serde_json::to_string(want).unwrap(),
                got = serde_json::to_string(got).unwrap()
            ));
        }
    }
    let listed: BTreeSet<String> = LISTED.iter().map(|d| (*d).to_owned()).collect();
    let new: Vec<&String> = found.difference(&listed).collect();
    let gone: Vec<&String> = listed.difference(&found).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "differences docs/sim.md does not list: {new:#?}\nlisted but gone: {gone:#?}\n{report}"
    );

    let page = std::fs::read_to_string(workspace_root().join("docs/sim.md")).unwrap();
    for difference in LISTED {
        assert!(
            page.contains(difference),
            "docs/sim.md does not list {difference:?}"
        );
    }
}

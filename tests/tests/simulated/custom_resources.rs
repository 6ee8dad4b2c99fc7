//! Custom resources on the simulator, from the SparkApplication definition in sim/crds/:
//! stock kubectl discovers, applies, gets, patches (status through its subresource) and
//! watches them, and kube-rs' dynamic API watches them as it would on a real cluster.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use podstream_sim::{Server, SimConfig};
use podstream_tests::{KubectlWatch, Sim, kube_client, kubectl, kubectl_has_subresource_flag, sim};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

fn run(sim: &Sim, args: &[&str]) -> String {
    let (ok, stdout, stderr) = kubectl(&sim.kubeconfig, args);
    assert!(ok, "kubectl {args:?} failed: {stderr}");
    stdout
}

fn application(name: &str) -> Value {
    json!({
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {
            "name": name,
            "namespace": "airflow",
            "labels": { "dag_id": "etl", "task_id": "crunch", "try_number": "1" },
        },
        "spec": { "type": "Python", "mode": "cluster", "mainApplicationFile": "local:///app.py" },
    })
}

fn spark_api(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("sparkoperator.k8s.io", "v1beta2", "SparkApplication");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "sparkapplications");
    Api::namespaced_with(client, "airflow", &resource)
}

/// The dynamic watcher's next event.
async fn next(
    events: &mut UnboundedReceiver<watcher::Result<Event<DynamicObject>>>,
) -> Event<DynamicObject> {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("the dynamic watcher went quiet")
        .expect("the dynamic watcher ended")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_and_kube_rs_serve_spark_applications_with_their_status_subresource() {
    let sim = sim(true).await;
    let resources = run(&sim, &["api-resources", "--api-group=sparkoperator.k8s.io"]);
    assert!(
        resources.contains("sparkapplications") && resources.contains("sparkapp"),
        "{resources}"
    );

    let kubectl_watch = KubectlWatch::start(
        &sim.kubeconfig,
        &[
            "get",
            "sparkapplications",
            "-n",
            "airflow",
            "-w",
            "-o",
            "json",
        ],
    );
    let api = spark_api(kube_client(&sim.server).await);
    // The dynamic watcher runs beside the test from here on; its list is done first.
    let mut kube_watch = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let (events, mut kube_events) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(event) = kube_watch.next().await {
            if events.send(event).is_err() {
                break;
            }
        }
    });
    while !matches!(next(&mut kube_events).await, Event::InitDone) {}

    // apply: created, the spec kept as written; a status in the body is not the main
    // resource's to set.
    let mut app = application("etl-crunch");
    app["status"] = json!({ "applicationState": { "state": "COMPLETED" } });
    let file = sim.dir.path().join("app.json");
    std::fs::write(&file, app.to_string()).unwrap();
    let created = run(&sim, &["apply", "-f", file.to_str().unwrap()]);
    assert!(
        created.contains("sparkapplication.sparkoperator.k8s.io/etl-crunch created"),
        "{created}"
    );
    let stored: Value = serde_json::from_str(&run(
        &sim,
        &[
            "get",
            "sparkapp",
            "etl-crunch",
            "-n",
            "airflow",
            "-o",
            "json",
        ],
    ))
    .unwrap();
    assert_eq!(stored["spec"]["mainApplicationFile"], "local:///app.py");
    assert_eq!(stored["status"], Value::Null, "{stored}");

    // The driver the operator tracks goes into the status, through the subresource.
    let status = json!({ "status": { "driverInfo": { "podName": "etl-crunch-driver" } } });
    if kubectl_has_subresource_flag() {
        run(
            &sim,
            &[
                "patch",
                "sparkapplication",
                "etl-crunch",
                "-n",
                "airflow",
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ],
        );
    } else {
        api.patch_status(
            "etl-crunch",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();
    }
    // A main-resource patch of the status changes nothing there.
    let other = json!({ "status": { "driverInfo": { "podName": "someone-else" } } });
    run(
        &sim,
        &[
            "patch",
            "sparkapp",
            "etl-crunch",
            "-n",
            "airflow",
            "--type=merge",
            "-p",
            &other.to_string(),
        ],
    );
    let got = api.get("etl-crunch").await.unwrap();
    assert_eq!(
        got.data["status"]["driverInfo"]["podName"], "etl-crunch-driver",
        "{got:?}"
    );

    // The table kubectl prints without -o.
    let table = run(&sim, &["get", "sparkapplications", "-n", "airflow"]);
    assert!(
        table.contains("NAME") && table.contains("AGE") && table.contains("etl-crunch"),
        "{table}"
    );

    run(&sim, &["delete", "sparkapp", "etl-crunch", "-n", "airflow"]);

    // kubectl's watch: the object as created, its status change, its deletion.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let value = kubectl_watch.next().expect("kubectl printed no event");
        seen.push(value["status"]["driverInfo"]["podName"].clone());
    }
    assert_eq!(seen[0], Value::Null);
    assert!(seen.contains(&json!("etl-crunch-driver")), "{seen:?}");

    // kube-rs: applied with the status the operator wrote, then deleted.
    let mut driver = None;
    let deleted = loop {
        match next(&mut kube_events).await {
            Event::Apply(app) | Event::InitApply(app) => {
                if let Some(name) = app.data["status"]["driverInfo"]["podName"].as_str() {
                    driver = Some(name.to_owned());
                }
            }
            Event::Delete(app) => break app,
            Event::Init | Event::InitDone => {}
        }
    };
    assert_eq!(driver.as_deref(), Some("etl-crunch-driver"));
    assert_eq!(deleted.metadata.name.as_deref(), Some("etl-crunch"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_without_a_definition_is_not_served() {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(addr, SimConfig::default()).await.unwrap();
    let api = spark_api(kube_client(&server).await);
    let error = api.get("etl-crunch").await.unwrap_err();
    assert!(
        matches!(&error, kube::Error::Api(status) if status.code == 404),
        "{error:?}"
    );
}

#[test]
fn podstream_sim_names_a_definition_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("pod.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: Pod\n").unwrap();
    let output = std::process::Command::new(podstream_tests::podstream_binary())
        .args(["sim", "--kubeconfig"])
        .arg(dir.path().join("kubeconfig"))
        .arg("--crd")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not an apiextensions.k8s.io/v1 CustomResourceDefinition"),
        "{stderr}"
    );
}

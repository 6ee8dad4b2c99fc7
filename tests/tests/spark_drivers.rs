//! Differential test of the Spark driver choice: for pods-only situations (no application
//! status), podstream's `spark::by_facts` must pick the pod the cncf.kubernetes provider's own
//! `SparkKubernetesOperator.find_spark_job` reattaches to, asked through the simulator with the
//! same pods (tests/airflow/find_spark_job.py, the newest listed Airflow's provider).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::Stdio;

use podstream_processor::spark::{DriverPod, by_facts};
use podstream_proto::v1::Phase;
use podstream_sim::object::Key;
use podstream_sim::{DeleteOptions, Deletion, Resource, Server, SimConfig};
use podstream_tests::airflow::Airflow;
use podstream_tests::workspace_root;
use serde_json::{Value, json};

const NS: &str = "airflow";
const CASES: usize = 300;
/// Three creation times, one second apart, so that equal times (and the name tie-break) occur.
const CREATED: [(&str, i64); 3] = [
    ("2026-09-21T14:13:20Z", 1_790_000_000),
    ("2026-09-21T14:13:21Z", 1_790_000_001),
    ("2026-09-21T14:13:22Z", 1_790_000_002),
];

const PHASES: [(Phase, &str); 5] = [
    (Phase::Pending, "Pending"),
    (Phase::Running, "Running"),
    (Phase::Succeeded, "Succeeded"),
    (Phase::Failed, "Failed"),
    (Phase::Unknown, "Unknown"),
];

/// A small deterministic generator (xorshift64*), so every run asks the same cases.
struct Cases(u64);

impl Cases {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podstream_chooses_the_driver_find_spark_job_chooses() {
    let airflow = Airflow::newest();
    airflow.installed().unwrap();
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let config = SimConfig {
        namespaces: vec![NS.into()],
        ..SimConfig::default()
    };
    let server = Server::start(addr, config).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let cluster = server.cluster();

    let mut generator = Cases(0x5eed_5eed_5eed_5eed);
    let mut expected = Vec::new();
    let mut cases = Vec::new();
    for case in 0..CASES {
        let task_id = format!("t{case}");
        let count = 1 + generator.below(4) as usize;
        let mut drivers = Vec::new();
        // Distinct letters per case; the name tie-break compares them.
        let mut letters: Vec<char> = "abcdef".chars().collect();
        for _ in 0..count {
            let letter = letters.remove(generator.below(letters.len() as u64) as usize);
            let (phase, phase_name) = PHASES[generator.below(5) as usize];
            let terminating = generator.below(10) < 3;
            let checked = generator.below(100) < 15;
            let (created_at, created_seconds) = CREATED[generator.below(3) as usize];
            let name = format!("{task_id}-{letter}-driver");
            let mut labels = json!({
                "dag_id": "spark_dag",
                "task_id": task_id,
                "run_id": "r1",
                "spark_kubernetes_operator": "True",
                "try_number": "1",
                "spark-role": "driver",
            });
            if checked {
                labels["already_checked"] = json!("True");
            }
            cluster
                .create_pod(json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": { "name": name, "namespace": NS, "labels": labels },
                    "spec": { "containers": [{ "name": "spark-kubernetes-driver", "image": "spark:3.5" }] },
                    "status": { "phase": phase_name },
                }))
                .unwrap();
            cluster
                .modify_pod(NS, &name, |pod| {
                    pod["metadata"]["creationTimestamp"] = json!(created_at);
                })
                .unwrap();
            if terminating {
                // A graceful delete with an hour's grace: terminating while the provider asks.
                let options = DeleteOptions {
                    grace_period_seconds: Some(3600),
                    ..DeleteOptions::default()
                };
                let key = Key::new(Resource::Pods, NS, &name);
                assert!(matches!(
                    cluster.delete(&key, &options).unwrap(),
                    Deletion::Pending(_)
                ));
            }
            drivers.push(DriverPod {
                name,
                phase,
                terminating,
                created_unix_ms: Some(created_seconds * 1000),
                checked,
            });
        }
        // The API lists a namespace's pods by name; the choice must not depend on it, but
        // the provider sees this order.
        drivers.sort_by(|a, b| a.name.cmp(&b.name));
        let chosen = by_facts(&drivers).map(|i| drivers[i].name.clone());
        expected.push((task_id.clone(), chosen, drivers));
        cases.push(
            json!({ "dag_id": "spark_dag", "task_id": task_id, "run_id": "r1", "try_number": 1 }),
        );
    }

    let script = workspace_root().join("tests/airflow/find_spark_job.py");
    let home = dir.path().join("airflow-home");
    std::fs::create_dir_all(&home).unwrap();
    let input = serde_json::to_vec(&cases).unwrap();
    let kubeconfig_arg = kubeconfig.display().to_string();
    let output = tokio::task::spawn_blocking(move || {
        let mut child = airflow
            .python(&home)
            .arg(script)
            .args([kubeconfig_arg.as_str(), NS])
            .env(
                "AIRFLOW_CONN_KUBERNETES_DEFAULT",
                r#"{"conn_type": "kubernetes"}"#,
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&input).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "find_spark_job.py: {stderr}");
    let answers: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(answers.len(), CASES, "{stderr}");

    let mut differences = Vec::new();
    let (mut several, mut none) = (0, 0);
    for ((task_id, chosen, drivers), answer) in expected.iter().zip(&answers) {
        assert_eq!(answer["task_id"], json!(task_id));
        let provider = answer["chosen"].as_str().map(str::to_owned);
        if provider != *chosen {
            differences.push(format!(
                "{task_id}: podstream {chosen:?}, provider {provider:?}, pods {drivers:?}"
            ));
        }
        several += usize::from(drivers.len() > 1 && chosen.is_some());
        none += usize::from(chosen.is_none());
    }
    assert!(
        differences.is_empty(),
        "{} of {CASES} cases differ:\n{}",
        differences.len(),
        differences.join("\n")
    );
    // The cases reach every part of the order: choices among several pods, and lists the
    // provider's selectors leave empty.
    assert!(
        several > CASES / 3 && none > 10,
        "several {several}, none {none}"
    );
}

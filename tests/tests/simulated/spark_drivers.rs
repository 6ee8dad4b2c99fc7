//! Differential test of the Spark driver choice: for pods-only situations (no application
//! status), podstream's `spark::by_facts` must pick the pod the cncf.kubernetes provider's own
//! `SparkKubernetesOperator.find_spark_job` reattaches to, asked through the simulator with the
//! same pods (tests/airflow/find_spark_job.py, the newest listed Airflow's provider).

use std::io::Write as _;
use std::process::Stdio;

use podstream_proto::subject::stream_names;
use podstream_proto::v1::Phase;
use podstream_rules::spark::{DriverPod, by_facts};
use podstream_sim::object::Key;
use podstream_sim::{DeleteOptions, Deletion, Resource};
use podstream_tests::airflow::Airflow;
use podstream_tests::{Sim, kubectl, podstream_binary, sim, workspace_root};
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

/// One driver pod of `task_id`, as the Spark operator makes it.
struct Driver<'a> {
    task_id: &'a str,
    name: &'a str,
    phase: &'a str,
    created_at: &'a str,
    terminating: bool,
    checked: bool,
    application: Option<&'a str>,
}

fn create_driver(sim: &Sim, driver: &Driver<'_>) {
    let cluster = sim.server.cluster();
    let mut labels = json!({
        "dag_id": "spark_dag",
        "task_id": driver.task_id,
        "run_id": "r1",
        "spark_kubernetes_operator": "True",
        "try_number": "1",
        "spark-role": "driver",
    });
    if driver.checked {
        labels["already_checked"] = json!("True");
    }
    if let Some(application) = driver.application {
        labels["sparkoperator.k8s.io/app-name"] = json!(application);
    }
    cluster
        .create_pod(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": driver.name, "namespace": NS, "labels": labels },
            "spec": { "containers": [{ "name": "spark-kubernetes-driver", "image": "spark:3.5" }] },
            "status": { "phase": driver.phase },
        }))
        .unwrap();
    let created_at = driver.created_at.to_owned();
    cluster
        .modify_pod(NS, driver.name, |pod| {
            pod["metadata"]["creationTimestamp"] = json!(created_at);
        })
        .unwrap();
    if driver.terminating {
        // A graceful delete with an hour's grace: terminating while the provider asks.
        let options = DeleteOptions {
            grace_period_seconds: Some(3600),
            ..DeleteOptions::default()
        };
        let key = Key::new(Resource::Pods, NS, driver.name);
        assert!(matches!(
            cluster.delete(&key, &options).unwrap(),
            Deletion::Pending(_)
        ));
    }
}

/// A SparkApplication `name` whose status says the Spark operator tracks driver `named`.
fn create_application(sim: &Sim, name: &str, named: &str) {
    let cluster = sim.server.cluster();
    let spark = cluster
        .served()
        .find("sparkoperator.k8s.io", "v1beta2", "sparkapplications")
        .unwrap();
    cluster
        .create(
            spark,
            NS,
            json!({
                "apiVersion": "sparkoperator.k8s.io/v1beta2",
                "kind": "SparkApplication",
                "metadata": { "name": name, "namespace": NS },
                "spec": { "type": "Python", "mode": "cluster" },
                "status": { "driverInfo": { "podName": named } },
            }),
            false,
        )
        .unwrap();
}

/// The driver the provider's own `find_spark_job` reattaches to, for each task.
async fn ask_provider(sim: &Sim, tasks: &[String]) -> Vec<Option<String>> {
    ask_operator(sim, tasks, "stock", None).await
}

/// The driver `find_spark_job` of the `stock` operator or of podstream-airflow's subclass
/// (`podstream`, asking podstream at `nats`) reattaches to, for each task.
async fn ask_operator(
    sim: &Sim,
    tasks: &[String],
    which: &'static str,
    nats: Option<String>,
) -> Vec<Option<String>> {
    let airflow = Airflow::newest();
    airflow.installed().unwrap();
    let cases: Vec<Value> = tasks
        .iter()
        .map(|task_id| json!({ "dag_id": "spark_dag", "task_id": task_id, "run_id": "r1", "try_number": 1 }))
        .collect();
    let script = workspace_root().join("tests/airflow/find_spark_job.py");
    let home = sim.dir.path().join("airflow-home");
    std::fs::create_dir_all(&home).unwrap();
    let input = serde_json::to_vec(&cases).unwrap();
    let kubeconfig = sim.kubeconfig.display().to_string();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = airflow.python(&home);
        if let Some(url) = &nats {
            command.env("AIRFLOW__PODSTREAM__URL", url);
        }
        let mut child = command
            .arg(script)
            .args([kubeconfig.as_str(), NS, which])
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
    assert_eq!(answers.len(), tasks.len(), "{stderr}");
    tasks
        .iter()
        .zip(answers)
        .map(|(task_id, answer)| {
            assert_eq!(answer["task_id"], json!(task_id));
            answer["chosen"].as_str().map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podstream_chooses_the_driver_find_spark_job_chooses() {
    let stage = sim(true).await;
    let mut generator = Cases(0x5eed_5eed_5eed_5eed);
    let mut expected = Vec::new();
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
            create_driver(
                &stage,
                &Driver {
                    task_id: &task_id,
                    name: &name,
                    phase: phase_name,
                    created_at,
                    terminating,
                    checked,
                    application: None,
                },
            );
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
        expected.push((task_id, chosen, drivers));
    }
    let tasks: Vec<String> = expected.iter().map(|(task, _, _)| task.clone()).collect();
    let answers = ask_provider(&stage, &tasks).await;

    let mut differences = Vec::new();
    let (mut several, mut none) = (0, 0);
    for ((task_id, chosen, drivers), provider) in expected.iter().zip(answers) {
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

/// Seed 003 with the SparkApplication in the picture: the stock `find_spark_job`, `podstream
/// decide` over kubectl's view of the same simulator, and podstream-airflow's
/// `PodstreamSparkKubernetesOperator` asking `ingest --spark` and `process --spark` running on
/// it, with two and three driver pods. The report shows where they differ: where the
/// application tracks an older driver than the one pod facts favour, the subclass reattaches
/// to the tracked one, as `decide` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_application_names_an_older_driver_podstream_and_stock_differ() {
    let stage = sim(true).await;
    let at = |i: usize| CREATED[i].0;
    let driver = |task_id, name, phase, created_at, terminating| Driver {
        task_id,
        name,
        phase,
        created_at,
        terminating,
        checked: false,
        application: Some(task_id),
    };
    // (task, the driver its application names, its drivers, stock's and podstream's choice)
    let scenarios = [
        (
            "two",
            "two-driver",
            vec![
                driver("two", "two-driver", "Running", at(0), false),
                driver("two", "two-driver-2", "Pending", at(1), false),
            ],
            ("two-driver-2", "two-driver", "spark_application"),
        ),
        (
            "three",
            "three-driver",
            vec![
                driver("three", "three-driver", "Running", at(0), false),
                driver("three", "three-driver-2", "Running", at(1), true),
                driver("three", "three-driver-3", "Pending", at(2), false),
            ],
            ("three-driver-3", "three-driver", "spark_application"),
        ),
        (
            "gone",
            "gone-driver",
            vec![
                driver("gone", "gone-driver-2", "Running", at(0), false),
                driver("gone", "gone-driver-3", "Pending", at(1), false),
            ],
            ("gone-driver-3", "gone-driver-3", "spark_pod_facts"),
        ),
    ];
    for (task, named, drivers, _) in &scenarios {
        create_application(&stage, task, named);
        for driver in drivers {
            create_driver(&stage, driver);
        }
    }

    let tasks: Vec<String> = scenarios.iter().map(|s| s.0.to_owned()).collect();
    let stock = ask_provider(&stage, &tasks).await;
    let podstream = decided_drivers(&stage);

    // The pipeline on the same simulator, and the subclass asking it.
    let nats = podstream_tests::nats::NatsServer::start();
    let url = nats.url();
    let pipeline = [
        vec!["ingest", "--spark", "--nats", &url, "--namespaces", NS],
        vec!["process", "--spark", "--nats", &url],
    ]
    .map(|args| {
        podstream_tests::component::Component::start(podstream_binary(), &args, &stage.kubeconfig)
    });
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    for (task, _, _, (_, want, why)) in &scenarios {
        wait_for_choice(&js, task, (want, why)).await;
    }
    let subclass = ask_operator(&stage, &tasks, "podstream", Some(url.clone())).await;
    drop(pipeline);

    println!(
        "task     drivers  stock find_spark_job  podstream decide (why)          PodstreamSparkKubernetesOperator"
    );
    for (((task, _, drivers, _), stock), subclass) in scenarios.iter().zip(&stock).zip(&subclass) {
        let (chosen, why) = podstream.get(*task).cloned().unwrap_or_default();
        let stock = stock.as_deref().unwrap_or("none");
        println!(
            "{task:<8} {:<8} {stock:<21} {:<32} {}{}",
            drivers.len(),
            format!("{chosen} ({why})"),
            subclass.as_deref().unwrap_or("none"),
            if subclass.as_deref() == Some(stock) {
                ""
            } else {
                "  <- differs from stock"
            },
        );
    }
    for (((task, _, _, (want_stock, want_podstream, want_why)), stock), subclass) in
        scenarios.iter().zip(&stock).zip(&subclass)
    {
        assert_eq!(stock.as_deref(), Some(*want_stock), "{task}: stock");
        assert_eq!(
            podstream.get(*task),
            Some(&(want_podstream.to_string(), want_why.to_string())),
            "{task}: podstream"
        );
        assert_eq!(
            subclass.as_deref(),
            Some(*want_podstream),
            "{task}: the subclass"
        );
    }
}

/// `podstream decide` over the applications, then the driver pods, as kubectl lists them:
/// each task's last reported driver and why.
fn decided_drivers(stage: &Sim) -> std::collections::HashMap<String, (String, String)> {
    let list = |args: &[&str]| {
        let (ok, stdout, stderr) = kubectl(&stage.kubeconfig, args);
        assert!(ok, "kubectl {args:?}: {stderr}");
        stdout
    };
    let mut input = list(&["get", "sparkapplications", "-n", NS, "-o", "json"]);
    input.push_str(&list(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        "spark-role=driver",
        "-o",
        "json",
    ]));
    let mut child = std::process::Command::new(podstream_binary())
        .arg("decide")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut chosen = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["kind"], "duplicate", "{line}");
        chosen.insert(
            line["ti"]["task_id"].as_str().unwrap().to_owned(),
            (
                line["chosen"]["name"].as_str().unwrap().to_owned(),
                line["reason"].as_str().unwrap().to_owned(),
            ),
        );
    }
    chosen
}

/// The key of a scenario task's job in the processor's Spark bucket.
fn job_key(task_id: &str) -> String {
    format!("job.{NS}.spark_dag.{task_id}.r1.-1")
}

/// The choice the processor keeps for `task_id`'s job: (pod name, basis), once there is one.
async fn kept_choice(
    js: &async_nats::jetstream::Context,
    task_id: &str,
) -> Option<(String, String)> {
    let bucket = js.get_key_value("podstream-spark").await.ok()?;
    let value = bucket.get(job_key(task_id)).await.ok()??;
    let record: Value = serde_json::from_slice(&value).ok()?;
    Some((
        record["chosen"]["pod"]["name"].as_str()?.to_owned(),
        record["chosen"]["basis"].as_str()?.to_owned(),
    ))
}

/// Waits up to 30 s for the processor to keep `want` as `task_id`'s choice.
async fn wait_for_choice(js: &async_nats::jetstream::Context, task_id: &str, want: (&str, &str)) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let kept = kept_choice(js, task_id).await;
        if kept.as_ref().map(|(p, b)| (p.as_str(), b.as_str())) == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{task_id}: kept {kept:?}, not {want:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `podstream ingest --spark` and `podstream process --spark` on the simulator: every change
/// of a driver pod or SparkApplication is on the Spark stream once, on its own subject; the
/// processor keeps each job's choice in its bucket (the application's word first) and reports
/// the duplicate on the commands stream; a driver deleted while the ingest is down gets its
/// synthesized delete from the checkpoint, and the choice falls back to the pods' facts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_keeps_each_jobs_driver_and_survives_an_ingest_restart() {
    use podstream_tests::component::Component;
    let stage = sim(true).await;
    let nats = podstream_tests::nats::NatsServer::start();
    let url = nats.url();
    let binary = podstream_binary();
    let mut ingest = Component::start(
        binary,
        &["ingest", "--spark", "--nats", &url, "--namespaces", NS],
        &stage.kubeconfig,
    );
    let process = Component::start(
        binary,
        &["process", "--spark", "--nats", &url],
        &stage.kubeconfig,
    );
    let at = |i: usize| CREATED[i].0;
    let cluster = stage.server.cluster();
    create_application(&stage, "crunch", "crunch-driver");
    for (name, phase, created_at) in [
        ("crunch-driver", "Running", at(0)),
        ("crunch-driver-2", "Pending", at(1)),
    ] {
        create_driver(
            &stage,
            &Driver {
                task_id: "crunch",
                name,
                phase,
                created_at,
                terminating: false,
                checked: false,
                application: Some("crunch"),
            },
        );
    }
    let client = async_nats::connect(&url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    // The application names the older running driver; on facts the newer pending one wins.
    wait_for_choice(&js, "crunch", ("crunch-driver", "spark_application")).await;
    let commands = js.get_stream(stream_names::COMMANDS).await.unwrap();
    let uid = |name: &str| {
        cluster
            .get(&Key::new(Resource::Pods, NS, name))
            .map(|pod| pod.uid.clone())
            .unwrap()
    };
    let reported = commands
        .get_last_raw_message_by_subject(&format!("podstream.commands.~.{}", uid("crunch-driver")))
        .await
        .unwrap();
    let command =
        <podstream_proto::Command as prost::Message>::decode(reported.payload.as_ref()).unwrap();
    let Some(podstream_proto::v1::command::Kind::Duplicate(duplicate)) = command.kind else {
        panic!("not a duplicate: {command:?}");
    };
    assert_eq!(
        duplicate.basis(),
        podstream_proto::v1::DuplicateBasis::SparkApplication
    );
    assert_eq!(duplicate.others.len(), 1);

    // Stopped, the ingest misses the named driver's delete; its successor synthesizes it.
    assert!(ingest.stop().success());
    let gone = Key::new(Resource::Pods, NS, "crunch-driver");
    drop(
        cluster
            .delete(
                &gone,
                &DeleteOptions {
                    grace_period_seconds: Some(0),
                    ..DeleteOptions::default()
                },
            )
            .unwrap(),
    );
    assert!(cluster.get(&gone).is_err());
    ingest.restart();
    wait_for_choice(&js, "crunch", ("crunch-driver-2", "spark_pod_facts")).await;

    // Every fact once: no two messages of the Spark stream share a subject and revision.
    let stream = js.get_stream(stream_names::SPARK).await.unwrap();
    let last = stream.clone().info().await.unwrap().state.last_sequence;
    let mut seen = std::collections::HashSet::new();
    let mut synthesized = 0;
    for sequence in 1..=last {
        let message = stream.get_raw_message(sequence).await.unwrap();
        let event =
            <podstream_proto::v1::SparkEvent as prost::Message>::decode(message.payload.as_ref())
                .unwrap();
        synthesized += usize::from(event.synthesized);
        assert!(
            seen.insert((message.subject.to_string(), event.resource_version.clone())),
            "{} at {} twice",
            message.subject,
            event.resource_version
        );
    }
    assert_eq!(synthesized, 1, "one synthesized delete");
    drop(process);
}

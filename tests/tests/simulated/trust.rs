//! The trust boundary through the `podstream` binary (docs/semantics.md, "Trust" and
//! "Bounded input"): pods that copy a running task instance's annotations change nothing,
//! whatever UUID they claim and wherever they are relabelled, and the real pod's failure still
//! applies afterwards; a pod whose names are out of bounds is a dead letter that leaves the
//! stages ready; a URL that cannot work is refused at once.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podstream_proto::TaskKey;
use podstream_sim::{Cluster, WorkerPod};
use podstream_sink::Database;
use podstream_sink::seed::SeedTi;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::component::Component;
use podstream_tests::nats::NatsServer;
use podstream_tests::podstream_binary;
use podstream_tests::postgres::PgCluster;
use podstream_tests::recovery::{self, NS};
use sqlx::Row;

const DAG: &str = "etl";
const RUN: &str = "manual__2026-11-30";
/// A UUID no task instance has.
const FORGED_ID: &str = "0196b3a0-0000-7000-8000-00000000f04d";

fn key(task_id: &str) -> TaskKey {
    podstream_sink::seed::first_try(DAG, task_id, RUN)
}

/// Polls `check` every 200 ms until it gives `Some`, or panics with `what` after `within`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn count(db: &Database, query: &str) -> i64 {
    sqlx::query(query)
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .try_get(0)
        .unwrap()
}

fn fail(cluster: &Cluster, name: &str) {
    cluster.set_phase(NS, name, "Failed").unwrap();
}

/// Seeds a running TI, runs `podstream run` (its `--db` given as `db_flag`), starts the TI's
/// real pod, then plays three copies of its annotations: one claiming another UUID, one
/// claiming none, one relabelled to scheduler 7; each runs and fails. The TI stays running,
/// with its owner. Then the real pod fails, and that failure applies.
async fn forged_pods_change_nothing(target: &AirflowDb, db_flag: &str) {
    let (sim, dir) = recovery::simulator().await;
    let nats = NatsServer::start();
    let db = Database::connect(&target.url).await.unwrap();
    db.seed(DAG, RUN, &[SeedTi::running("victim", 1)])
        .await
        .unwrap();
    // The task process runs in its pod: its hostname is the pod's name.
    sqlx::query("UPDATE task_instance SET hostname = 'victim-1' WHERE task_id = 'victim'")
        .execute(&db.pool)
        .await
        .unwrap();
    let real_id = db.task_instance(&key("victim")).await.unwrap().unwrap().id;
    let run = Component::run(&nats.url(), db_flag, &dir.path().join("kubeconfig"), &[]);
    let cluster = sim.cluster();
    let pod = |name: &str, id: Option<&str>, created: &str| {
        let mut pod = WorkerPod::new(name, "1", DAG, "victim", RUN)
            .with_task_instance_id(id)
            .to_json();
        pod["metadata"]["creationTimestamp"] = created.into();
        pod
    };
    cluster
        .create_pod(pod("victim-1", real_id.as_deref(), "2026-11-30T10:00:00Z"))
        .unwrap();
    cluster.set_phase(NS, "victim-1", "Running").unwrap();
    // podstream has recorded the real pod for the try before any copy appears.
    eventually("the real pod's record", Duration::from_secs(60), || async {
        (count(
            &db,
            "SELECT COUNT(*) FROM podstream_ti_pod WHERE pod_name = 'victim-1'",
        )
        .await
            == 1)
            .then_some(())
    })
    .await;

    // Newer than the real pod, so each wins the order while it runs.
    cluster
        .create_pod(pod("forged-uuid", Some(FORGED_ID), "2026-11-30T10:01:00Z"))
        .unwrap();
    cluster.set_phase(NS, "forged-uuid", "Running").unwrap();
    fail(cluster, "forged-uuid");
    // Without a UUID: foreign to an Airflow 3 row by its UUID, to an Airflow 2 row by the
    // hostname of the running task.
    cluster
        .create_pod(pod("forged-bare", None, "2026-11-30T10:02:00Z"))
        .unwrap();
    cluster.set_phase(NS, "forged-bare", "Running").unwrap();
    fail(cluster, "forged-bare");
    cluster
        .create_pod(pod("forged-relabel", None, "2026-11-30T10:03:00Z"))
        .unwrap();
    cluster.set_phase(NS, "forged-relabel", "Running").unwrap();
    cluster
        .relabel(NS, "forged-relabel", "airflow-worker", Some("7"))
        .unwrap();
    fail(cluster, "forged-relabel");

    let foreign = "SELECT COUNT(*) FROM podstream_applied WHERE outcome = 'foreign_pod'";
    eventually(
        "the copies' commands skipped",
        Duration::from_secs(60),
        || async { (count(&db, foreign).await >= 3).then_some(()) },
    )
    .await;
    // Whatever else of theirs was still on its way has arrived by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let row = db.task_instance(&key("victim")).await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.queued_by_job_id),
        ("running", Some(1)),
        "the copies changed the task instance"
    );
    let transfers = "SELECT COUNT(*) FROM podstream_applied WHERE outcome = 'transfer'";
    assert_eq!(
        count(&db, transfers).await,
        0,
        "a copy's relabel moved the owner"
    );

    fail(cluster, "victim-1");
    let row = eventually("the real failure", Duration::from_secs(60), || async {
        let row = db.task_instance(&key("victim")).await.unwrap().unwrap();
        (row.state == "up_for_retry").then_some(row)
    })
    .await;
    assert_eq!(row.queued_by_job_id, Some(1));
    assert!(run.terminate().success(), "run exits 0 on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_pods_change_nothing_on_airflow_2_sqlite() {
    let target = AirflowDb::sqlite(Airflow::line("2.10"));
    forged_pods_change_nothing(&target, &target.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_pods_change_nothing_on_airflow_3_sqlite() {
    let target = AirflowDb::sqlite(Airflow::line("3.1"));
    forged_pods_change_nothing(&target, &target.url).await;
}

/// On PostgreSQL, `--db` as Airflow's `sql_alchemy_conn` has it (`postgresql+psycopg2://`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_pods_change_nothing_on_airflow_2_postgres() {
    let pg = PgCluster::start();
    let target = AirflowDb::postgres(Airflow::line("2.10"), &pg, "trust2");
    forged_pods_change_nothing(&target, &target.sqlalchemy_url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_pods_change_nothing_on_airflow_3_postgres() {
    let pg = PgCluster::start();
    let target = AirflowDb::postgres(Airflow::line("3.1"), &pg, "trust3");
    forged_pods_change_nothing(&target, &target.sqlalchemy_url).await;
}

/// Copies of queued task instances' pods, through `podstream run` (no signatures): one that
/// succeeds before the real pod exists mutes nothing (the real pod's failure still applies once
/// the task runs), and a newer Pending copy whose container reason is `Error` fails nothing
/// while the real pod waits (no pod is bound to the try yet).
async fn copies_of_queued_pods_mute_and_fail_nothing(target: &AirflowDb) {
    use podstream_sim::ContainerState;
    let (sim, dir) = recovery::simulator().await;
    let nats = NatsServer::start();
    let db = Database::connect(&target.url).await.unwrap();
    let queued = |task_id| SeedTi {
        state: Some("queued"),
        ..SeedTi::running(task_id, 1)
    };
    db.seed(DAG, RUN, &[queued("early"), queued("window")])
        .await
        .unwrap();
    let run = Component::run(
        &nats.url(),
        &target.url,
        &dir.path().join("kubeconfig"),
        &[],
    );
    let cluster = sim.cluster();
    let pod = |name: &str, task_id: &str, created: &str| {
        let mut pod = WorkerPod::new(name, "1", DAG, task_id, RUN).to_json();
        pod["metadata"]["creationTimestamp"] = created.into();
        pod
    };
    let state = |task_id: &'static str| {
        let db = db.clone();
        async move {
            db.task_instance(&key(task_id))
                .await
                .unwrap()
                .unwrap()
                .state
        }
    };

    // The window: the real pod waits; a newer copy stays Pending, its first container unable
    // to pull and another ended with `Error` (the reason Airflow's default excludes).
    cluster
        .create_pod(pod("window-1", "window", "2026-11-30T10:00:00Z"))
        .unwrap();
    cluster
        .create_pod(pod("window-copy", "window", "2026-11-30T10:01:00Z"))
        .unwrap();
    let waiting = ContainerState::Waiting {
        reason: "ErrImagePull".into(),
        message: "no such image".into(),
    };
    let ended = ContainerState::Terminated {
        exit_code: 1,
        reason: "Error".into(),
        message: String::new(),
    };
    cluster
        .set_container_state(NS, "window-copy", "sidecar", ended)
        .unwrap();
    cluster
        .set_container_state(NS, "window-copy", "base", waiting)
        .unwrap();
    let recorded = "SELECT COUNT(*) FROM podstream_applied WHERE outcome = 'launch_failed'";
    eventually(
        "the copy's fail recorded",
        Duration::from_secs(60),
        || async { (count(&db, recorded).await >= 1).then_some(()) },
    )
    .await;
    assert_eq!(state("window").await, "queued", "a copy failed a queued TI");

    // Copy first: it succeeds before the real pod exists; then the real pod runs (the task
    // starts, as Airflow records it) and fails.
    cluster
        .create_pod(pod("early-copy", "early", "2026-11-30T10:00:00Z"))
        .unwrap();
    cluster.set_phase(NS, "early-copy", "Succeeded").unwrap();
    cluster
        .create_pod(pod("early-1", "early", "2026-11-30T10:02:00Z"))
        .unwrap();
    cluster.set_phase(NS, "early-1", "Running").unwrap();
    sqlx::query(
        "UPDATE task_instance SET state = 'running', hostname = 'early-1' WHERE task_id = 'early'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    fail(cluster, "early-1");
    eventually(
        "the real pod's failure",
        Duration::from_secs(60),
        || async { (state("early").await == "up_for_retry").then_some(()) },
    )
    .await;
    assert_eq!(state("window").await, "queued");
    assert!(run.terminate().success(), "run exits 0 on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_of_queued_pods_mute_and_fail_nothing_on_airflow_2() {
    copies_of_queued_pods_mute_and_fail_nothing(&AirflowDb::sqlite(Airflow::line("2.10"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_of_queued_pods_mute_and_fail_nothing_on_airflow_3() {
    copies_of_queued_pods_mute_and_fail_nothing(&AirflowDb::sqlite(Airflow::line("3.1"))).await;
}

/// A pod whose dag_id is past Airflow's limit, and pods whose annotations are 200 KB: the first
/// is a dead letter with its reason (and without its spec), the stages stay ready, and the
/// other task instances are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversized_pods_are_dead_letters_and_the_stages_go_on() {
    let (sim, dir) = recovery::simulator().await;
    let nats = NatsServer::start();
    let target = AirflowDb::sqlite(Airflow::line("2.10"));
    let db = Database::connect(&target.url).await.unwrap();
    let tasks: Vec<String> = (0..40).map(|i| format!("big{i:02}")).collect();
    let mut tis: Vec<SeedTi<'_>> = tasks.iter().map(|t| SeedTi::running(t, 0)).collect();
    tis.push(SeedTi::running("after", 0));
    db.seed(DAG, RUN, &tis).await.unwrap();
    let ops: std::net::SocketAddr = format!("127.0.0.1:{}", podstream_tests::free_port())
        .parse()
        .unwrap();
    let run = Component::run(
        &nats.url(),
        &target.url,
        &dir.path().join("kubeconfig"),
        &["--metrics-listen", &ops.to_string()],
    );
    let cluster = sim.cluster();
    let mut long = WorkerPod::new("long-dag", "1", &"d".repeat(5_000), "t", RUN).to_json();
    long["spec"]["containers"][0]["env"] =
        serde_json::json!([{ "name": "PASSWORD", "value": "hunter2" }]);
    cluster.create_pod(long).unwrap();
    // 40 pods with 200 KB of annotations beside their key: the key is all the rules read.
    let filler = "x".repeat(200 * 1024);
    for task in &tasks {
        let mut pod = WorkerPod::new(&format!("{task}-1"), "1", DAG, task, RUN).to_json();
        pod["metadata"]["annotations"]["notes"] = filler.clone().into();
        cluster.create_pod(pod).unwrap();
        cluster
            .set_phase(NS, &format!("{task}-1"), "Failed")
            .unwrap();
    }
    cluster
        .create_pod(WorkerPod::new("after-1", "1", DAG, "after", RUN).to_json())
        .unwrap();
    cluster.set_phase(NS, "after-1", "Failed").unwrap();

    let mut expected: Vec<&str> = tasks.iter().map(String::as_str).collect();
    expected.push("after");
    eventually(
        "every other TI decided",
        Duration::from_secs(90),
        || async {
            let mut failed = 0;
            for task in &expected {
                let row = db.task_instance(&key(task)).await.unwrap().unwrap();
                failed += usize::from(row.state == "failed");
            }
            (failed == expected.len()).then_some(())
        },
    )
    .await;
    let (status, body) = podstream_tests::http_get(ops, "/readyz").unwrap();
    assert_eq!(status, 200, "{body}");
    // The dead letter: the reason, the pod, no spec.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let subjects = podstream_proto::subject::Subjects::default();
    let stream = js
        .get_stream(subjects.stream_name(podstream_proto::subject::Stream::DeadLetters))
        .await
        .unwrap();
    let message = stream
        .get_last_raw_message_by_subject(
            &subjects.dead_letters(podstream_proto::subject::Stage::Ingest),
        )
        .await
        .unwrap();
    let headers = message.headers;
    let reason = headers
        .get(podstream_bus::dead::REASON_HEADER)
        .map(|v| v.to_string())
        .unwrap_or_default();
    assert!(reason.contains("250"), "{reason}");
    let payload = String::from_utf8_lossy(&message.payload).into_owned();
    assert!(payload.contains("long-dag"), "{payload}");
    assert!(
        !payload.contains("hunter2"),
        "a dead letter kept the spec: {payload}"
    );
    let (_, metrics) = podstream_tests::http_get(ops, "/metrics").unwrap();
    let rss = podstream_tests::rss_mb(run.id());
    assert!(
        rss.0 < 400,
        "podstream run holds {rss:?} MB after 8 MB of annotations"
    );
    assert!(!metrics.is_empty());
    assert!(run.terminate().success());
}

/// A `--nats` URL that can name no server is refused at once, not retried as unreachable.
#[test]
fn an_unparsable_nats_url_is_refused_at_once() {
    for url in ["not a url:::", "nats://"] {
        let started = Instant::now();
        let output = Command::new(podstream_binary())
            .args(["process", "--nats", url])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{url}: {stderr}");
        assert!(stderr.contains("invalid NATS URL"), "{url}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{url}: took {:?}",
            started.elapsed()
        );
    }
}

/// A `--db` URL that can name no database is refused at once with the URL, its password
/// redacted, before NATS or Kubernetes is tried.
#[test]
fn an_unparsable_db_url_is_refused_at_once() {
    for url in [
        "not a url",
        "mysql://airflow@db/airflow",
        "postgres://airflow:s3cret@db:notaport/airflow",
    ] {
        let started = Instant::now();
        let output = Command::new(podstream_binary())
            .args(["run", "--nats", "nats://127.0.0.1:1", "--db", url])
            .env("KUBECONFIG", "/nonexistent")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{url}: {stderr}");
        assert!(stderr.contains("database URL"), "{url}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{url}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{url}: took {:?}",
            started.elapsed()
        );
    }
}

/// Two Airflow deployments in one namespace whose schedulers have the same job id, each with
/// its own metadata DB: each `podstream run` watches its own deployment's pods
/// (`--pod-selector release=…`, the official chart's release label) under its own `--prefix`
/// on one NATS, so its streams, consumers, buckets and Lease are its own. A failure of one
/// deployment's pod fails only that deployment's task instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_deployments_in_one_namespace_never_meet() {
    let (sim, dir) = recovery::simulator().await;
    let nats = NatsServer::start();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut deployments = Vec::new();
    for release in ["airflow-a", "airflow-b"] {
        let target = AirflowDb::sqlite(Airflow::line("3.1"));
        let db = Database::connect(&target.url).await.unwrap();
        db.seed(DAG, RUN, &[SeedTi::running("work", 1)])
            .await
            .unwrap();
        let selector = format!("release={release}");
        let run = Component::run(
            &nats.url(),
            &target.url,
            &kubeconfig,
            &["--prefix", release, "--pod-selector", &selector],
        );
        deployments.push((release, target, db, run));
    }
    // The same TI key and owner in both deployments; only the release label tells them apart.
    let cluster = sim.cluster();
    for (release, ..) in &deployments {
        let name = format!("{release}-work-1");
        let mut pod = WorkerPod::new(&name, "1", DAG, "work", RUN).to_json();
        pod["metadata"]["labels"]["release"] = (*release).into();
        cluster.create_pod(pod).unwrap();
        cluster.set_phase(NS, &name, "Running").unwrap();
    }
    for (release, _, db, _) in &deployments {
        let own =
            format!("SELECT COUNT(*) FROM podstream_ti_pod WHERE pod_name = '{release}-work-1'");
        eventually(
            "each deployment's pod recorded",
            Duration::from_secs(60),
            || async { (count(db, &own).await == 1).then_some(()) },
        )
        .await;
    }

    fail(cluster, "airflow-a-work-1");
    let (_, _, db_a, _) = &deployments[0];
    eventually(
        "deployment a's failure",
        Duration::from_secs(60),
        || async {
            let row = db_a.task_instance(&key("work")).await.unwrap().unwrap();
            (row.state == "up_for_retry").then_some(())
        },
    )
    .await;
    // Whatever of a's failure could have reached b has arrived by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, _, db_b, _) = &deployments[1];
    let row = db_b.task_instance(&key("work")).await.unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.queued_by_job_id),
        ("running", Some(1)),
        "deployment a's pod changed deployment b's task instance"
    );
    for (own, other) in [(0, "airflow-b"), (1, "airflow-a")] {
        let (_, _, db, _) = &deployments[own];
        let foreign =
            format!("SELECT COUNT(*) FROM podstream_ti_pod WHERE pod_name = '{other}-work-1'");
        assert_eq!(
            count(db, &foreign).await,
            0,
            "a pod of {other} was recorded"
        );
    }
    // Each deployment's state is under its prefix.
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    for (release, ..) in &deployments {
        let subjects = podstream_proto::subject::Subjects::new(release).unwrap();
        for role in ["ingest", "process"] {
            let bucket = subjects.resource_name(role);
            assert!(
                js.get_key_value(&bucket).await.is_ok(),
                "no bucket {bucket}"
            );
        }
    }
    for (_, _, _, run) in deployments {
        assert!(run.terminate().success(), "run exits 0 on SIGTERM");
    }
}

/// Every bucket and Lease name under the default prefix is the one the defaults give.
#[test]
fn the_default_prefix_names_the_default_buckets_and_lease() {
    let subjects = podstream_proto::subject::Subjects::default();
    use podstream_ingest::{leadership, service as ingest};
    use podstream_processor::spark as spark_service;
    for (role, default) in [
        (ingest::CHECKPOINT_ROLE, ingest::DEFAULT_CHECKPOINT_BUCKET),
        (leadership::LEASE_ROLE, leadership::DEFAULT_LEASE_NAME),
        (
            podstream_bus::streams::RECORDS_BUCKET_ROLE,
            podstream_bus::streams::DEFAULT_RECORDS_BUCKET,
        ),
        (
            spark_service::SPARK_ROLE,
            spark_service::DEFAULT_SPARK_BUCKET,
        ),
    ] {
        assert_eq!(subjects.resource_name(role), default);
    }
}

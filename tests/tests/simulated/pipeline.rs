//! The whole pipeline through the `podstream` binary: the simulator as the cluster, a real
//! nats-server, real Airflow databases. `podstream run` on PostgreSQL (Airflow 3.1) plays the
//! seed stories; the three components as separate processes on SQLite (Airflow 2.10) are each
//! killed with SIGKILL mid-scenario and restarted, and the DB still ends right, once.

use std::time::{Duration, Instant};

use podstream_proto::TaskKey;
use podstream_sim::{Cluster, WorkerPod};
use podstream_sink::Database;
use podstream_sink::seed::SeedTi;
use podstream_tests::airflow::{Airflow, AirflowDb};
use podstream_tests::component::Component;
use podstream_tests::nats::{NatsCluster, NatsServer};
use podstream_tests::podstream_binary;
use podstream_tests::postgres::PgCluster;
use podstream_tests::recovery::{self, Kill, NS, Stage};
use sqlx::Row;

const DAG: &str = "etl";
const RUN: &str = "manual__2026-11-30";

fn key(task_id: &str) -> TaskKey {
    podstream_sink::seed::first_try(DAG, task_id, RUN)
}

/// Waits until every (task, state, queued_by_job_id) holds, or panics with what differs.
async fn wait_for(db: &Database, expected: &[(String, &str, i64)], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut wrong = Vec::new();
        for (task, state, job) in expected {
            let row = db.task_instance(&key(task)).await.unwrap().unwrap();
            if row.state != *state || row.queued_by_job_id != Some(*job) {
                wrong.push(format!("{task}: {row:?}, expected {state} by {job}"));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} wrong, e.g. {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn pod_exists(cluster: &Cluster, name: &str) -> bool {
    cluster.pod(NS, name).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_plays_the_seed_stories_on_postgres() {
    let (sim, dir) = recovery::simulator().await;
    let nats = NatsServer::start();
    let pg = PgCluster::start();
    let target = AirflowDb::postgres(Airflow::line("3.1"), &pg, "pipeline");
    let db = Database::connect(&target.url).await.unwrap();
    let tis: Vec<SeedTi<'_>> = ["adopted", "retried", "failed", "twins"]
        .iter()
        .map(|task_id| SeedTi::running(task_id, if *task_id == "failed" { 0 } else { 1 }))
        .collect();
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
    // Airflow 3's executor names the TI's UUID on its pods; a pod without it is foreign.
    let mut ids = std::collections::HashMap::new();
    for task in ["adopted", "retried", "failed", "twins"] {
        let row = db.task_instance(&key(task)).await.unwrap().unwrap();
        ids.insert(task, row.id);
    }
    let pod = |name: &str, task: &str| {
        WorkerPod::new(name, "1", DAG, task, RUN).with_task_instance_id(ids[task].as_deref())
    };
    let create = |name: &str, task: &str| {
        cluster.create_pod(pod(name, task).to_json()).unwrap();
        cluster.set_phase(NS, name, "Running").unwrap();
    };
    create("adopted-1", "adopted");
    create("retried-1", "retried");
    create("failed-1", "failed");
    create("twins-1", "twins");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Seed 1: scheduler 2 adopts a running pod.
    cluster
        .relabel(NS, "adopted-1", "airflow-worker", Some("2"))
        .unwrap();
    // A graceful delete of running pods: retries left, and none.
    cluster.delete_pod(NS, "retried-1", Some(1)).unwrap();
    cluster.delete_pod(NS, "failed-1", Some(1)).unwrap();
    // Seed 3: a newer pod for the same TI, which then fails.
    let mut twin = pod("twins-2", "twins").to_json();
    twin["metadata"]["creationTimestamp"] = "2099-01-01T00:00:00Z".into();
    cluster.create_pod(twin).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.set_phase(NS, "twins-2", "Failed").unwrap();

    let expected = vec![
        ("adopted".to_owned(), "running", 2),
        ("retried".to_owned(), "up_for_retry", 1),
        ("failed".to_owned(), "failed", 1),
        ("twins".to_owned(), "running", 1),
    ];
    wait_for(&db, &expected, Duration::from_secs(60)).await;
    // Settled, and nothing else arrives: the loser's failure fails nothing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_for(&db, &expected, Duration::from_secs(1)).await;
    assert!(
        pod_exists(cluster, "adopted-1"),
        "no pod is deleted by a relabel"
    );
    let duplicates: i64 = sqlx::query("SELECT COUNT(*) FROM podstream_duplicate")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
    assert!(duplicates >= 1, "the duplicate pods are recorded");

    // The apiserver compacts its history while the watch reconnects: a 410, then a list.
    cluster.set_latency(Duration::from_millis(300));
    cluster.drop_watches();
    let mut other = WorkerPod::new("other-1", "1", DAG, "other", RUN).to_json();
    other["metadata"]["labels"]["airflow-worker"] = "9".into();
    cluster.create_pod(other).unwrap();
    cluster.compact();
    cluster.set_latency(Duration::ZERO);
    let readyz = || podstream_tests::http_get(ops, "/readyz").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let (status, metrics) = podstream_tests::http_get(ops, "/metrics").unwrap();
        assert_eq!(status, 200);
        let expired = podstream_tests::metric_sum(
            &metrics,
            podstream_bus::metrics::INGEST_WATCH_EXPIRED,
            &[],
        );
        if expired >= 1.0 && readyz().0 == 200 {
            break metrics;
        }
        assert!(Instant::now() < deadline, "no 410 counted: {metrics}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The operations endpoint: counters moved, ready; not ready while the database is down.
    let sum = |metric: &str, labels: &[&str]| podstream_tests::metric_sum(&metrics, metric, labels);
    use podstream_bus::metrics as m;
    assert!(sum(m::INGEST_EVENTS_PUBLISHED, &[]) >= 8.0, "{metrics}");
    assert!(
        sum(m::PROCESSOR_COMMANDS, &["kind=\"fail\""]) >= 1.0,
        "{metrics}"
    );
    assert!(
        sum(m::SINK_COMMANDS, &["outcome=\"applied\""]) >= 4.0,
        "{metrics}"
    );
    assert!(
        sum(&format!("{}_count", m::SINK_BATCH_SECONDS), &[]) >= 1.0,
        "{metrics}"
    );
    assert_eq!(sum(m::INGEST_LEADER, &[]), 1.0, "{metrics}");
    let acks = format!("{}_count", m::INGEST_PUBLISH_ACK_SECONDS);
    assert!(sum(&acks, &[]) >= 8.0, "{metrics}");
    for consumer in ["podstream-process", "podstream-sink"] {
        let label = format!("consumer=\"{consumer}\"");
        assert!(
            metrics.contains(&format!("{}{{{label}}}", m::CONSUMER_PENDING)),
            "{metrics}"
        );
    }
    for condition in ["watch_synced", "consumer_bound", "database_answers"] {
        let label = format!("condition=\"{condition}\"");
        assert_eq!(sum(m::READY, &[&label]), 1.0, "{metrics}");
    }
    assert_eq!(podstream_tests::http_get(ops, "/healthz").unwrap().0, 200);
    assert_eq!(readyz().0, 200, "{}", readyz().1);

    pg.stop();
    // A change to apply: the sink's batch meets the stopped database.
    cluster.set_phase(NS, "adopted-1", "Succeeded").unwrap();
    let until = |want: u16, within: Duration| {
        let deadline = Instant::now() + within;
        loop {
            let (status, body) = readyz();
            if status == want {
                return body;
            }
            assert!(Instant::now() < deadline, "/readyz stayed {status}: {body}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let body = until(503, Duration::from_secs(30));
    assert!(body.contains("database_answers: not ready"), "{body}");
    let (_, metrics) = podstream_tests::http_get(ops, "/metrics").unwrap();
    let label = "condition=\"database_answers\"";
    assert_eq!(
        podstream_tests::metric_sum(&metrics, m::READY, &[label]),
        0.0,
        "{metrics}"
    );
    pg.restart();
    until(200, Duration::from_secs(60));
    assert!(run.terminate().success(), "run exits 0 on SIGTERM");
}

/// The moments of [`sixty_tasks`] where a test disrupts the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    /// Half the pods created and running.
    Creating,
    /// A third of the pods adopted, deleted or succeeded.
    EndingFirstThird,
    /// Two thirds of them.
    EndingSecondThird,
}

/// Waits until an ingest has claimed the checkpoint (its `leader` key): it watches from then
/// on, so the changes that follow are seen one by one, not collapsed into a first list.
async fn wait_for_the_ingest_to_lead(nats: &str) {
    let servers: Vec<&str> = nats.split(',').collect();
    let js = async_nats::jetstream::new(async_nats::connect(servers.as_slice()).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(kv) = js.get_key_value("podstream-ingest").await
            && let Ok(Some(_)) = kv.get("leader").await
        {
            return;
        }
        assert!(Instant::now() < deadline, "no ingest led within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The three components as separate processes.
struct Components {
    ingest: Component,
    process: Component,
    sink: Component,
}

/// Sixty running tasks: a third adopted by scheduler 2, a third deleted while running, a third
/// succeeded, with `disrupt` called at each [`Moment`]. The database must end right with every
/// command applied once. `extra` goes to every component (`--stream-replicas 3`).
async fn sixty_tasks(nats: &str, extra: &[&str], mut disrupt: impl FnMut(Moment, &mut Components)) {
    const TASKS: usize = 60;
    let (sim, dir) = recovery::simulator().await;
    let kubeconfig = dir.path().join("kubeconfig");
    let target = AirflowDb::sqlite(Airflow::line("2.10"));
    let db = Database::connect(&target.url).await.unwrap();
    let names: Vec<String> = (0..TASKS).map(|i| format!("t{i}")).collect();
    let tis: Vec<SeedTi<'_>> = names
        .iter()
        .map(|task_id| SeedTi::running(task_id, 1))
        .collect();
    db.seed(DAG, RUN, &tis).await.unwrap();
    let with_extra = |args: &[&str]| -> Vec<String> {
        args.iter().chain(extra).map(|a| (*a).to_owned()).collect()
    };
    let start = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Component::start(podstream_binary(), &args, &kubeconfig)
    };
    let mut components = Components {
        ingest: start(with_extra(&["ingest", "--nats", nats, "--namespaces", NS])),
        process: start(with_extra(&[
            "process",
            "--nats",
            nats,
            "--failover-seconds",
            "2",
        ])),
        sink: start(with_extra(&["sink", "--nats", nats, "--db", &target.url])),
    };

    wait_for_the_ingest_to_lead(nats).await;
    let cluster = sim.cluster();
    for (i, task) in names.iter().enumerate() {
        let pod = format!("{task}-pod");
        cluster
            .create_pod(WorkerPod::new(&pod, "1", DAG, task, RUN).to_json())
            .unwrap();
        cluster.set_phase(NS, &pod, "Running").unwrap();
        if i == TASKS / 2 {
            disrupt(Moment::Creating, &mut components);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, task) in names.iter().enumerate() {
        let pod = format!("{task}-pod");
        match i % 3 {
            0 => drop(
                cluster
                    .relabel(NS, &pod, "airflow-worker", Some("2"))
                    .unwrap(),
            ),
            1 => drop(cluster.delete_pod(NS, &pod, Some(1)).unwrap()),
            _ => drop(cluster.set_phase(NS, &pod, "Succeeded").unwrap()),
        }
        if i == TASKS / 3 {
            disrupt(Moment::EndingFirstThird, &mut components);
        }
        if i == 2 * TASKS / 3 {
            disrupt(Moment::EndingSecondThird, &mut components);
        }
    }
    let expected: Vec<(String, &str, i64)> = names
        .iter()
        .enumerate()
        .map(|(i, task)| match i % 3 {
            0 => (task.clone(), "running", 2),
            1 => (task.clone(), "up_for_retry", 1),
            _ => (task.clone(), "running", 1),
        })
        .collect();
    wait_for(&db, &expected, Duration::from_secs(120)).await;

    // Applied once: one log row per failed try and per transfer, one applied row per command.
    let count = |sql: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
                .try_get::<i64, _>(0)
                .unwrap()
        }
    };
    // A `completed` changes no state: the states can be right before the last ones apply.
    let deadline = Instant::now() + Duration::from_secs(60);
    while count("SELECT COUNT(*) FROM podstream_applied").await < (2 * TASKS) as i64
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        count("SELECT COUNT(*) FROM log WHERE event = 'podstream_fail'").await,
        (TASKS / 3) as i64
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM log WHERE event = 'podstream_transfer'").await,
        (TASKS / 3) as i64
    );
    let applied = count("SELECT COUNT(*) FROM podstream_applied").await;
    let distinct = count("SELECT COUNT(DISTINCT command_id) FROM podstream_applied").await;
    assert_eq!(applied, distinct);
    // running for all, then transfer / fail / completed for each.
    assert_eq!(
        applied,
        (2 * TASKS) as i64,
        "every command applied exactly once"
    );
    let Components {
        ingest,
        process,
        sink,
    } = components;
    for component in [ingest, process, sink] {
        assert!(component.terminate().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_component_killed_mid_scenario_and_restarted_still_ends_right_once() {
    let nats = NatsServer::start();
    sixty_tasks(&nats.url(), &[], |moment, components| match moment {
        Moment::Creating => {
            // After a checkpoint write (one a second): killed before its first, an ingest
            // leaves its successor no revision to replay from, and changes made while the
            // successor waits for the lease arrive collapsed into a list.
            std::thread::sleep(Duration::from_millis(1500));
            components.ingest.kill_and_restart();
        }
        Moment::EndingFirstThird => components.process.kill_and_restart(),
        Moment::EndingSecondThird => components.sink.kill_and_restart(),
    })
    .await;
}

/// A three-node JetStream cluster with every stream and bucket replicated three times: one
/// node killed with SIGKILL mid-scenario, the database still ends right with every command
/// applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_jetstream_node_killed_under_r3_streams_loses_nothing() {
    let mut nats = NatsCluster::start(3);
    nats.ready().await;
    let urls = nats.urls();
    sixty_tasks(&urls, &["--stream-replicas", "3"], |moment, _| {
        if moment == Moment::Creating {
            nats.kill(1);
        }
    })
    .await;
}

/// Each stage (`run`, and `ingest`, `process`, `sink` as separate processes) killed with
/// SIGKILL at several points just after a running pod failed, with changes while it is down:
/// the database ends right and every command is applied once. The time from the kill and
/// from the restart to the last commit is printed; `cargo bench --bench recovery` records
/// its distribution.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_stage_killed_just_after_a_failure_resumes_its_in_flight_work_once() {
    podstream_tests::init_tracing();
    let unlocked = Stage::ALL
        .into_iter()
        .flat_map(|stage| [0, 10, 25, 50].map(|ms| (stage, Duration::from_millis(ms), false)));
    // With the database locked, the sink certainly holds the fail when it dies.
    let locked = [Stage::Run, Stage::Sink].map(|stage| (stage, Duration::ZERO, true));
    for (stage, after, lock_database) in unlocked.chain(locked) {
        let kill = Kill {
            stage,
            after,
            down: Duration::from_millis(500),
            ack_wait_seconds: podstream_bus::config::DEFAULT_ACK_WAIT_SECONDS,
            lock_database,
        };
        let recovery = recovery::play(podstream_binary(), kill).await;
        eprintln!(
            "{} killed {} ms after the failure{}: last commit {:.2} s after the kill, {:.2} s after the restart",
            stage.name(),
            after.as_millis(),
            if lock_database {
                ", database locked"
            } else {
                ""
            },
            recovery.from_kill,
            recovery.from_restart
        );
    }
}

//! A real Airflow scheduler of each release runs DAGs on `podstream sim --kubelet`, on
//! PostgreSQL, with the stock KubernetesExecutor alone, and with podstream-airflow's
//! PodstreamKubernetesExecutor taking its pods' outcomes from `podstream run`: either way,
//! tasks succeed, a failing task retries and ends failed, each callback runs once, and the
//! worker pods are deleted.

use std::time::Duration;

use podstream_tests::airflow::Airflow;
use podstream_tests::real_airflow::{Dags, Executor, RealAirflow, TiRow};

const DAG: &str = "podstream_checks";

/// How long after a run ends its callbacks may take (a failure callback runs in the DAG
/// processor, after the TI's state is written).
const CALLBACKS: Duration = Duration::from_secs(60);

fn ti(task_id: &str, state: &str, try_number: i64) -> TiRow {
    TiRow {
        task_id: task_id.to_owned(),
        state: state.to_owned(),
        try_number,
    }
}

fn runs_the_dags(airflow: Airflow) {
    runs_the_dags_with(airflow, Executor::Stock);
}

fn runs_the_dags_with(airflow: Airflow, executor: Executor) {
    let real = RealAirflow::start_with(airflow, Dags::Checks, executor);
    refuses_a_client_without_its_secret(&real);
    let state = real.wait_for_run(DAG, Duration::from_secs(240));
    let version = airflow.short();
    assert_eq!(
        state,
        "failed",
        "Airflow {version}: `fails` fails the run\n{}",
        real.logs()
    );
    assert_eq!(
        real.tis(DAG),
        [
            ti("fails", "failed", 2),
            ti("runs_long", "success", 1),
            ti("succeeds", "success", 1)
        ],
        "Airflow {version}\n{}",
        real.logs()
    );
    assert_eq!(
        real.markers_settled(4, CALLBACKS),
        [
            "failure.podstream_checks.fails.2",
            "retry.podstream_checks.fails.1",
            "success.podstream_checks.runs_long.1",
            "success.podstream_checks.succeeds.1",
        ],
        "Airflow {version}: one callback per event"
    );
    let log = real.logs_of("scheduler").join("\n");
    if executor == Executor::Stock {
        assert!(
            log.contains("and now my watch begins"),
            "Airflow {version}: the stock executor's watcher says when it starts\n{log}"
        );
    }
    if executor == Executor::Podstream {
        assert!(
            // A task that raises ends its own try (the pod succeeds): each pod's end is a
            // `completed`.
            log.contains("podstream: taking commands on podstream.commands.")
                && log.contains("enters the executor as None"),
            "Airflow {version}: the outcomes came from podstream's commands\n{log}"
        );
        assert!(
            !log.contains("and now my watch begins"),
            "Airflow {version}: no KubernetesJobWatcher ran\n{log}"
        );
    }
    // delete_worker_pods: every worker pod goes once the executor has its result.
    let left = real.wait_for_pods(Duration::from_secs(60), <[_]>::is_empty);
    println!(
        "=== Airflow {version}, {executor:?} executor (a normal run): run {state}\n{}",
        real.timeline()
    );
    let names: Vec<_> = left.iter().map(|p| p["metadata"]["name"].clone()).collect();
    assert!(
        names.is_empty(),
        "Airflow {version}: pods left {names:?}\n{}",
        real.logs()
    );
}

/// The stage (the one `demo --airflow` plays on) lets no other local user in: its PostgreSQL
/// takes `postgres` only with the password made for it, its nats-server only clients that
/// present the token made for it.
fn refuses_a_client_without_its_secret(real: &RealAirflow) {
    let conn = real
        .env()
        .iter()
        .find(|(name, _)| name == "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
        .map(|(_, url)| url.clone())
        .unwrap();
    let port = conn.rsplit_once(':').unwrap().1.split('/').next().unwrap();
    assert!(
        conn.contains("postgres:") && conn.contains('@'),
        "no password in {conn}"
    );
    let output = std::process::Command::new(podstream_tests::postgres::pg_bin().join("psql"))
        .args([
            "-w",
            "-h",
            "127.0.0.1",
            "-p",
            port,
            "-U",
            "postgres",
            "-d",
            "airflow",
        ])
        .args(["-c", "SELECT 1"])
        .env_remove("PGPASSWORD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("password"),
        "PostgreSQL let postgres in without its password: {stderr}"
    );
    if let Some(url) = real.nats_url() {
        let (_, host) = url.split_once('@').unwrap();
        let bare = format!("nats://{host}");
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let anonymous = runtime.block_on(async { async_nats::connect(bare.as_str()).await });
        assert!(
            anonymous.is_err(),
            "the nats-server took a client without its token"
        );
    }
}

#[test]
fn airflow_2_10_runs_the_dags_on_the_simulator() {
    runs_the_dags(Airflow::line("2.10"));
}

#[test]
fn airflow_2_11_runs_the_dags_on_the_simulator() {
    runs_the_dags(Airflow::line("2.11"));
}

#[test]
fn airflow_3_1_runs_the_dags_on_the_simulator() {
    runs_the_dags(Airflow::line("3.1"));
}

#[test]
fn airflow_3_3_runs_the_dags_on_the_simulator() {
    runs_the_dags(Airflow::line("3.3"));
}

#[test]
fn airflow_2_10_with_podstreams_executor_runs_the_dags() {
    runs_the_dags_with(Airflow::line("2.10"), Executor::Podstream);
}

#[test]
fn airflow_3_1_with_podstreams_executor_runs_the_dags() {
    runs_the_dags_with(Airflow::line("3.1"), Executor::Podstream);
}

/// Runs `dag` (one task, `task`, with one retry, whose every try fails) on Airflow with
/// podstream's executor: the run fails, the task ends failed on try 2, and each callback runs
/// once. Prints the timeline under `what`; returns the stage for the story's own checks.
fn fails_after_one_retry(
    airflow: Airflow,
    dags: Dags,
    dag: &str,
    task: &str,
    what: &str,
) -> RealAirflow {
    let real = RealAirflow::start_with(airflow, dags, Executor::Podstream);
    let state = real.wait_for_run(dag, Duration::from_secs(360));
    let version = airflow.short();
    println!(
        "=== Airflow {version}, Podstream executor ({what}): run {state}\n{}",
        real.timeline()
    );
    assert_eq!(state, "failed", "Airflow {version}\n{}", real.logs());
    assert_eq!(
        real.tis(dag),
        [ti(task, "failed", 2)],
        "Airflow {version}\n{}",
        real.logs()
    );
    assert_eq!(
        real.markers_settled(2, CALLBACKS),
        [
            format!("failure.{dag}.{task}.2"),
            format!("retry.{dag}.{task}.1"),
        ],
        "Airflow {version}: one callback per try\n{}",
        real.timeline()
    );
    real
}

/// A pod killed under its running task (OOMKilled): podstream's `fail` enters the executor,
/// and Airflow retries once, then fails the task, each callback once.
fn a_killed_pod_fails_its_try(airflow: Airflow) {
    let real = fails_after_one_retry(
        airflow,
        Dags::Failures,
        "podstream_failures",
        "killed",
        "a killed pod",
    );
    let log = real.logs_of("scheduler").join("\n");
    assert!(
        log.contains("enters the executor as failed"),
        "Airflow {}: the failure came from podstream\n{log}",
        airflow.short()
    );
}

#[test]
fn airflow_2_10_with_podstreams_executor_retries_a_killed_pod() {
    a_killed_pod_fails_its_try(Airflow::line("2.10"));
}

#[test]
fn airflow_3_1_with_podstreams_executor_retries_a_killed_pod() {
    a_killed_pod_fails_its_try(Airflow::line("3.1"));
}

/// A task whose pods never start (image pull): podstream's `fail` reaches the executor while the
/// TI is still queued, and the provider's own handling runs. From cncf.kubernetes 10.20 it
/// relaunches each try's pod once without spending a retry (`pods_per_try` 2), before that it
/// fails the try at once (1); either way Airflow retries once, then fails, each callback once.
fn a_pod_that_never_starts_fails_its_try(airflow: Airflow, pods_per_try: usize) {
    let real = fails_after_one_retry(
        airflow,
        Dags::LaunchFailures,
        "podstream_launch_failures",
        "unpullable",
        "a pod that never starts",
    );
    let version = airflow.short();
    let tries: Vec<String> = real
        .pods()
        .iter()
        .filter_map(|pod| {
            pod["metadata"]["annotations"]["try_number"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    for try_number in ["1", "2"] {
        assert_eq!(
            tries.iter().filter(|t| *t == try_number).count(),
            pods_per_try,
            "Airflow {version}: pods of try {try_number} (tries of all pods: {tries:?})\n{}",
            real.timeline()
        );
    }
}

#[test]
fn airflow_2_10_with_podstreams_executor_fails_a_pod_that_never_starts() {
    a_pod_that_never_starts_fails_its_try(Airflow::line("2.10"), 1);
}

#[test]
fn airflow_3_1_with_podstreams_executor_relaunches_a_pod_that_never_starts() {
    a_pod_that_never_starts_fails_its_try(Airflow::line("3.1"), 2);
}

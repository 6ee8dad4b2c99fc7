//! podstream-airflow, the Python package that lets a scheduler take podstream's decisions:
//! its copy of the bus schema is podstream's own, and its pytest suite passes in every
//! Airflow venv that `scripts/setup.sh` installs it into, with a real nats-server, the
//! simulator and a metadata DB made by Airflow's migrations.

use std::process::Command;

use podstream_tests::airflow::Airflow;
use podstream_tests::nats::nats_server_binary;
use podstream_tests::{podstream_binary, workspace_root};

/// The descriptor set the package ships, beside its Python code.
const SHIPPED_SCHEMA: &str = "podstream-airflow/src/podstream_airflow/podstream.binpb";

/// Set to rewrite the shipped copies from the build's (after a change to the `.proto` or to
/// anything the contract names).
const UPDATE: &str = "PODSTREAM_UPDATE_AIRFLOW_SCHEMA";

#[test]
fn the_package_ships_podstreams_own_schema() {
    let path = workspace_root().join(SHIPPED_SCHEMA);
    if std::env::var_os(UPDATE).is_some() {
        std::fs::write(&path, podstream_proto::FILE_DESCRIPTOR_SET).unwrap();
    }
    let shipped = std::fs::read(&path).unwrap_or_default();
    assert!(
        shipped == podstream_proto::FILE_DESCRIPTOR_SET,
        "{SHIPPED_SCHEMA} differs from proto/podstream/v1/podstream.proto as built; \
         rewrite it with {UPDATE}=1 cargo test -p podstream-tests --test airflow podstream_airflow::"
    );
}

/// What the package relies on of podstream, made from the Rust definitions: docs/contract.md
/// §7 in machine-readable form. The package's pytest suite (`tests/test_contract.py`) holds
/// its own constants and functions against it.
const SHIPPED_CONTRACT: &str = "podstream-airflow/tests/contract.json";

/// The contract, from the Rust definitions (and the sink's tables as it creates them).
async fn contract() -> serde_json::Value {
    use podstream_proto::signature::{PodSigning, SIGNATURE_ANNOTATION, signed_text};
    use podstream_proto::subject::{DEFAULT_PREFIX, Subjects, encode_key_token, encode_token};
    use serde_json::json;
    use sqlx::Row;

    let subjects = Subjects::new(DEFAULT_PREFIX).unwrap();
    let owners = ["7", "job 7.a", ""];
    let values = [
        "airflow",
        "etl.daily run",
        "scheduled__2026-01-01T00:00:00+00:00",
        "",
    ];
    let job = podstream_rules::spark::JobKey {
        namespace: "airflow".into(),
        dag_id: "spark.dag".into(),
        task_id: "submit job".into(),
        run_id: "manual__2026-12-06T10:00:00+00:00".into(),
        map_index: 2,
    };
    let mut record = podstream_rules::spark::JobRecord::default();
    record.chosen = Some(podstream_rules::spark::Chosen {
        pod: podstream_proto::PodRef {
            namespace: "airflow".into(),
            name: "submit-job-driver".into(),
            uid: "0b6d2c1e-5f0a-4c7e-9d35-7f1b2a4c6e80".into(),
        },
        basis: "spark_application".into(),
        others: Vec::new(),
    });
    let key = "k".repeat(32);
    let pod = podstream_proto::PodRef {
        namespace: "airflow".into(),
        name: "etl-load-x7k2".into(),
        ..Default::default()
    };
    let task = podstream_proto::TaskKey {
        dag_id: "etl".into(),
        task_id: "load".into(),
        run_id: "manual__2026-12-06".into(),
        map_index: 3,
        try_number: 2,
        ..Default::default()
    };
    let signer = PodSigning::new([key.as_bytes()]).unwrap();
    let target = podstream_tests::airflow::AirflowDb::sqlite(Airflow::line("3.1"));
    let db = podstream_sink::Database::connect(&target.url)
        .await
        .unwrap();
    let columns: Vec<String> =
        sqlx::query("SELECT name FROM pragma_table_info('podstream_ti_pod') ORDER BY cid")
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
    assert!(!columns.is_empty(), "the sink made no podstream_ti_pod");
    json!({
        "about": "What podstream-airflow relies on of podstream (docs/contract.md), made from the Rust definitions by tests/tests/airflow/podstream_airflow.rs; PODSTREAM_UPDATE_AIRFLOW_SCHEMA=1 rewrites it.",
        "subject_prefix": DEFAULT_PREFIX,
        "commands_filters": owners.iter().map(|owner| json!({
            "owner": owner, "filter": subjects.commands_filter(Some(owner)),
        })).collect::<Vec<_>>(),
        "tokens": values.iter().map(|value| json!({
            "value": value, "token": encode_token(value), "key_token": encode_key_token(value),
        })).collect::<Vec<_>>(),
        "sink_consumer": podstream_sink::service::DEFAULT_CONSUMER,
        "task_failures_metadata": podstream_sink::service::TASK_FAILURES_METADATA,
        "task_failures_executor": podstream_sink::guard::TaskFailures::Executor.name(),
        "inbox_prefixes": {
            "podstream-airflow": podstream_bus::connect::inbox_prefix("podstream-airflow"),
            "podstream-spark": podstream_bus::connect::inbox_prefix("podstream-spark"),
        },
        "spark_bucket": podstream_processor::spark::DEFAULT_SPARK_BUCKET,
        "spark_job": {
            "namespace": job.namespace, "dag_id": job.dag_id, "task_id": job.task_id,
            "run_id": job.run_id, "map_index": job.map_index, "key": job.kv_key(),
            "record": serde_json::to_string(&record).unwrap(),
            "chosen_name": "submit-job-driver",
            "chosen_basis": "spark_application",
        },
        "signature": {
            "annotation": SIGNATURE_ANNOTATION,
            "key": key,
            "namespace": pod.namespace,
            "name": pod.name,
            "annotations": {
                "dag_id": task.dag_id, "task_id": task.task_id, "run_id": task.run_id,
                "map_index": task.map_index.to_string(), "try_number": task.try_number.to_string(),
            },
            "signed_text": signed_text(&pod, &task),
            "value": signer.sign(&pod, &task),
        },
        "ti_pod": {
            "table": "podstream_ti_pod",
            "columns": columns,
            "live_commands": podstream_sink::guard::LIVE_POD_COMMANDS,
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_package_ships_podstreams_own_contract() {
    let path = workspace_root().join(SHIPPED_CONTRACT);
    let made = format!(
        "{}\n",
        serde_json::to_string_pretty(&contract().await).unwrap()
    );
    if std::env::var_os(UPDATE).is_some() {
        std::fs::write(&path, &made).unwrap();
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        shipped == made,
        "{SHIPPED_CONTRACT} differs from what the Rust definitions say; \
         rewrite it with {UPDATE}=1 cargo test -p podstream-tests --test airflow podstream_airflow::, \
         then make the package agree (its tests/test_contract.py)"
    );
}

/// The package passes ruff (errors, import order, likely bugs) and mypy, in the newest Airflow
/// (pyproject.toml holds their settings).
#[test]
fn the_package_passes_ruff_and_mypy() {
    let airflow = Airflow::newest();
    let python = airflow.venv_bin().join("python");
    let package = workspace_root().join("podstream-airflow");
    for check in [
        &["-m", "ruff", "check", "--no-cache", "src", "tests"][..],
        &[
            "-m",
            "mypy",
            "--cache-dir=/dev/null",
            "src/podstream_airflow",
        ][..],
    ] {
        let output = Command::new(&python)
            .args(check)
            .current_dir(&package)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
        assert!(
            output.status.success(),
            "{check:?} in Airflow {}:\n{}\n{}",
            airflow.short(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn the_pytest_suite_passes_in_every_airflow() {
    for airflow in Airflow::all() {
        let python = airflow.venv_bin().join("python");
        let output = Command::new(&python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"])
            .arg(workspace_root().join("podstream-airflow/tests"))
            .current_dir(workspace_root().join("podstream-airflow"))
            .env("PODSTREAM_BIN", podstream_binary())
            .env("PODSTREAM_NATS_SERVER", nats_server_binary())
            .env("PODSTREAM_AIRFLOW_DB", airflow.cached_sqlite())
            .env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
            .env("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "pytest in Airflow {}:\n{stdout}\n{stderr}",
            airflow.short()
        );
        assert!(
            !stdout.contains("skipped"),
            "every test runs here, none skipped (Airflow {}):\n{stdout}",
            airflow.short()
        );
    }
}

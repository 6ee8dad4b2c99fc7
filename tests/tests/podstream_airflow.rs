//! podstream-airflow, the Python package that lets a scheduler take podstream's decisions:
//! its copy of the bus schema is podstream's own, and its pytest suite passes in every
//! Airflow venv that `scripts/setup.sh` installs it into, with a real nats-server, the
//! simulator and a metadata DB made by Airflow's migrations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use podstream_tests::airflow::Airflow;
use podstream_tests::nats::nats_server_binary;
use podstream_tests::{podstream_binary, workspace_root};

/// The descriptor set the package ships, beside its Python code.
const SHIPPED_SCHEMA: &str = "podstream-airflow/src/podstream_airflow/podstream.binpb";

/// Set to rewrite the shipped copy from the build's (after a change to the `.proto`).
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
         rewrite it with {UPDATE}=1 cargo test -p podstream-tests --test podstream_airflow"
    );
}

/// The package's default Spark bucket is the processor's: the operator reads where
/// `podstream process --spark` writes.
#[test]
fn the_package_reads_the_spark_bucket_the_processor_writes() {
    let config = std::fs::read_to_string(
        workspace_root().join("podstream-airflow/src/podstream_airflow/config.py"),
    )
    .unwrap();
    let default = format!(
        "DEFAULT_SPARK_BUCKET = \"{}\"",
        podstream_processor::spark::service::DEFAULT_SPARK_BUCKET
    );
    assert!(config.contains(&default), "config.py lacks {default}");
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

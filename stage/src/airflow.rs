//! Airflow metadata databases made by Airflow (`scripts/airflow-db.sh` caches them), task
//! instances to seed them with, and reading states back through Airflow itself.

use std::path::PathBuf;
use std::process::Command;

use podstream_sink::airflow::{self as releases, AirflowRelease, AirflowSchema};
use podstream_sink::dialect::Backend;

use crate::postgres::PgCluster;
use crate::workspace_root;

/// An Airflow release the sink supports (`sink/airflow-versions.tsv`), as the tests use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Airflow(pub &'static AirflowRelease);

impl Airflow {
    /// Every supported release, oldest first.
    pub fn all() -> Vec<Airflow> {
        releases::supported().iter().map(Airflow).collect()
    }

    /// The supported release of a line (`2.10`).
    ///
    /// # Panics
    /// When the list has no such line.
    pub fn line(line: &str) -> Airflow {
        Airflow::find(line)
            .unwrap_or_else(|| panic!("sink/airflow-versions.tsv has no line {line}"))
    }

    /// The supported release of a line (`2.10`), if the list has it.
    pub fn find(line: &str) -> Option<Airflow> {
        Airflow::all().into_iter().find(|a| a.0.line == line)
    }

    /// What a stage of this release needs that `scripts/setup.sh` makes: its venv and its
    /// cached PostgreSQL dump. `Err` names the first missing one.
    pub fn installed(self) -> Result<(), String> {
        let airflow = self.venv_bin().join("airflow");
        for path in [airflow, self.cache_path("pg.sql")] {
            if !path.exists() {
                return Err(format!(
                    "{} is missing: run scripts/setup.sh",
                    path.display()
                ));
            }
        }
        Ok(())
    }

    /// The oldest supported release.
    pub fn oldest() -> Airflow {
        Airflow::all()[0]
    }

    /// The newest supported release.
    pub fn newest() -> Airflow {
        Airflow::all()[Airflow::all().len() - 1]
    }

    /// The venv's Python with a scratch `AIRFLOW_HOME`, no example DAGs, and the venv first on
    /// `PATH` (so `airflow` is this release).
    pub fn python(self, home: &std::path::Path) -> Command {
        let mut command = Command::new(self.venv_bin().join("python"));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.venv_bin()];
        paths.extend(std::env::split_paths(&path));
        command
            .env("AIRFLOW_HOME", home)
            .env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
            .env("PATH", std::env::join_paths(paths).unwrap_or(path));
        command
    }

    /// The release line, `2.10`.
    pub fn short(self) -> &'static str {
        self.0.line
    }

    /// The cached venv's `bin` directory.
    pub fn venv_bin(self) -> PathBuf {
        workspace_root().join(format!("target/tools/airflow-{}/bin", self.short()))
    }

    /// Whether this is an Airflow 3 release.
    pub fn is_3(self) -> bool {
        self.0.schema() == AirflowSchema::V3
    }

    /// The processes a running Airflow is made of, in start order.
    pub fn components(self) -> &'static [&'static str] {
        if self.is_3() {
            &["api-server", "dag-processor", "scheduler"]
        } else {
            &["scheduler"]
        }
    }

    /// The cached SQLite database `airflow db migrate` made (copy it before writing).
    pub fn cached_sqlite(self) -> PathBuf {
        self.cached("sqlite")
    }

    /// The cached `pg_dump` of a database `airflow db migrate` made.
    pub fn cached_pg_dump(self) -> PathBuf {
        self.cached("pg.sql")
    }

    fn cache_path(self, suffix: &str) -> PathBuf {
        workspace_root().join(format!(
            "target/airflow-db/airflow-{}.{suffix}",
            self.short()
        ))
    }

    fn cached(self, suffix: &str) -> PathBuf {
        let path = self.cache_path(suffix);
        assert!(
            path.exists(),
            "{} is missing: run scripts/setup.sh (it runs scripts/airflow-db.sh)",
            path.display()
        );
        path
    }
}

/// A fresh metadata DB for one test.
pub struct AirflowDb {
    /// Its URL for podstream (`sqlite:///...` or `postgres://...`).
    pub url: String,
    /// Its SQLAlchemy URL, for Airflow.
    pub sqlalchemy_url: String,
    /// Which Airflow made it.
    pub airflow: Airflow,
    _dir: Option<tempfile::TempDir>,
}

impl AirflowDb {
    /// A copy of the cached SQLite database.
    ///
    /// # Panics
    /// When the cache is missing or the copy fails.
    pub fn sqlite(airflow: Airflow) -> AirflowDb {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let path = dir.path().join("airflow.db");
        std::fs::copy(airflow.cached_sqlite(), &path)
            .unwrap_or_else(|e| panic!("copying the cached database: {e}"));
        AirflowDb {
            url: format!("sqlite://{}", path.display()),
            sqlalchemy_url: format!("sqlite:///{}", path.display()),
            airflow,
            _dir: Some(dir),
        }
    }

    /// A new database on `cluster`, restored from the cached dump.
    pub fn postgres(airflow: Airflow, cluster: &PgCluster, name: &str) -> AirflowDb {
        cluster.create_database(name, Some(&airflow.cached_pg_dump()));
        let url = cluster.url(name);
        AirflowDb {
            sqlalchemy_url: url.replacen("postgres://", "postgresql+psycopg2://", 1),
            url,
            airflow,
            _dir: None,
        }
    }

    /// Whether this is PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres")
    }

    /// SQL inserting a DAG run and task instances, in this database's dialect and schema.
    pub fn seed_sql(&self, dag_id: &str, run_id: &str, tis: &[SeedTi<'_>]) -> Vec<String> {
        let airflow = self.airflow.0.schema();
        let backend = if self.is_postgres() {
            Backend::Postgres
        } else {
            Backend::Sqlite
        };
        podstream_sink::seed::statements(airflow, backend, dag_id, run_id, tis)
    }

    /// Task instance states as Airflow's own ORM reads them: (task_id, map_index) → state.
    ///
    /// # Panics
    /// When Airflow cannot read the database.
    pub fn states_through_airflow(&self, dag_id: &str) -> Vec<(String, i64, String)> {
        let script = format!(
            "from airflow.utils.session import create_session\n\
             from airflow.models.taskinstance import TaskInstance as TI\n\
             with create_session() as s:\n\
             \x20   for ti in s.query(TI).filter(TI.dag_id == {dag_id:?}).order_by(TI.task_id, TI.map_index):\n\
             \x20       print(ti.task_id, ti.map_index, ti.state)\n"
        );
        let home = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let output = Command::new(self.airflow.venv_bin().join("python"))
            .arg("-c")
            .arg(script)
            .env("AIRFLOW_HOME", home.path())
            .env("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", &self.sqlalchemy_url)
            .env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
            .output()
            .unwrap_or_else(|e| panic!("running Airflow: {e}"));
        assert!(
            output.status.success(),
            "Airflow could not read the database: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                Some((
                    parts.next()?.to_owned(),
                    parts.next()?.parse().ok()?,
                    parts.next()?.to_owned(),
                ))
            })
            .collect()
    }
}

pub use podstream_sink::seed::SeedTi;

//! The metadata-database flags shared by `apply`, `sink` and `run`.

use anyhow::Context;
use clap::Args;
use podstream_sink::db::DbTarget;
use podstream_sink::guard::{Policy, TaskFailures};

/// Where the metadata DB is and how to log in.
#[derive(Debug, Args)]
pub struct DbArgs {
    /// Metadata DB URL: sqlite:///abs/path.db or postgres://user@host:port/db. TLS by URL
    /// parameters: ?sslmode=verify-full&sslrootcert=CA.pem (the server's CA), and
    /// &sslcert=FILE&sslkey=FILE for a client certificate. `run` defaults to Airflow's own
    /// SQLite file, $AIRFLOW_HOME/airflow.db (AIRFLOW_HOME defaults to ~/airflow).
    #[arg(long = "db", env = "PODSTREAM_DB", hide_env_values = true)]
    pub db: Option<String>,
    /// File holding the database password (kept out of the URL and the process list).
    #[arg(long, env = "PODSTREAM_DB_PASSWORD_FILE")]
    pub db_password_file: Option<std::path::PathBuf>,
    /// Container reasons (comma-separated) for which a pod that failed while its TI was still
    /// `queued` fails the TI at once; for any other reason the sink records `launch_failed`
    /// and leaves the TI to the executor, which relaunches it without spending a retry. Keep
    /// it equal to Airflow's [kubernetes_executor] pod_launch_failure_excluded_container_reasons.
    #[arg(
        long,
        env = "PODSTREAM_LAUNCH_FAILURE_EXCLUDED_REASONS",
        default_value = podstream_sink::guard::DEFAULT_LAUNCH_FAILURE_EXCLUDED_REASONS
    )]
    pub launch_failure_excluded_reasons: String,
    /// Who fails a task instance when its pod fails: `sink` (the schedulers run the stock
    /// KubernetesExecutor) or `executor` (they run podstream_airflow.PodstreamKubernetesExecutor,
    /// which takes the fail itself and runs Airflow's own retries and callbacks; the sink then
    /// records fails and applies transfers only). A sink refuses to start while a consumer of
    /// the commands stream declares the other.
    #[arg(
        long,
        env = "PODSTREAM_TASK_FAILURES",
        value_enum,
        default_value_t = TaskFailuresArg::Sink
    )]
    pub task_failures: TaskFailuresArg,
    /// On Airflow 3, take a pod as a TI's only when it names the TI's UUID (its
    /// `task_instance_id` annotation); a pod without one is foreign. Only for an Airflow whose
    /// executor writes that annotation: the executors of Airflow 3.0 to 3.3 with
    /// cncf.kubernetes 10.25 key task instances by name and write none.
    #[arg(long, env = "PODSTREAM_REQUIRE_TASK_INSTANCE_ID")]
    pub require_task_instance_id: bool,
}

/// `--task-failures`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TaskFailuresArg {
    /// The sink fails task instances.
    Sink,
    /// The schedulers' PodstreamKubernetesExecutor fails them.
    Executor,
}

impl From<TaskFailuresArg> for TaskFailures {
    fn from(arg: TaskFailuresArg) -> TaskFailures {
        match arg {
            TaskFailuresArg::Sink => TaskFailures::Sink,
            TaskFailuresArg::Executor => TaskFailures::Executor,
        }
    }
}

impl DbArgs {
    /// What the sink's guard applies beside the TI rows.
    pub fn policy(&self) -> Policy {
        Policy::with_launch_failure_excluded_reasons(&self.launch_failure_excluded_reasons)
            .with_task_failures(self.task_failures.into())
            .requiring_task_instance_id(self.require_task_instance_id)
    }

    /// The database, with the password from `PODSTREAM_DB_PASSWORD` or the password file.
    pub fn target(&self) -> anyhow::Result<DbTarget> {
        let db = self
            .db
            .as_deref()
            .context("--db (or PODSTREAM_DB) is required: sqlite:///abs/path.db or postgres://user@host:port/db")?;
        self.with_password(db)
    }

    /// The database, or Airflow's default SQLite DB when `--db` is not given.
    pub fn target_or_airflow_default(&self) -> anyhow::Result<DbTarget> {
        match &self.db {
            Some(_) => self.target(),
            None => {
                let home = match std::env::var_os("AIRFLOW_HOME") {
                    Some(home) => std::path::PathBuf::from(home),
                    None => std::env::var_os("HOME")
                        .map(|h| std::path::PathBuf::from(h).join("airflow"))
                        .context("no --db, no AIRFLOW_HOME and no HOME to find airflow.db in")?,
                };
                Ok(DbTarget::at(&format!(
                    "sqlite://{}",
                    home.join("airflow.db").display()
                )))
            }
        }
    }

    fn with_password(&self, db: &str) -> anyhow::Result<DbTarget> {
        let password = match &self.db_password_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .trim_end_matches(['\n', '\r'])
                    .to_owned(),
            ),
            None => std::env::var("PODSTREAM_DB_PASSWORD").ok(),
        };
        let target = DbTarget {
            url: db.to_owned(),
            password,
        };
        target.check()?;
        Ok(target)
    }
}

//! The Airflow releases podstream supports, from `sink/airflow-versions.tsv` (the one list that
//! `scripts/airflow-db.sh`, the tests and the demo read too), and the metadata schema a
//! database has: by its alembic revision when the list knows it, else by its columns.

use std::sync::LazyLock;

/// The list, as compiled in.
const VERSIONS: &str = include_str!("../airflow-versions.tsv");

/// A supported Airflow release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AirflowRelease {
    /// `2.10`, `3.3`: the release line.
    pub line: &'static str,
    /// `2.10.5`: the exact release.
    pub release: &'static str,
    /// The apache-airflow-providers-cncf-kubernetes release that goes with it.
    pub kubernetes_provider: &'static str,
    /// The alembic head revision `airflow db migrate` leaves.
    pub alembic_head: &'static str,
}

impl AirflowRelease {
    /// The metadata schema family of its databases.
    pub fn schema(&self) -> AirflowSchema {
        if self.line.starts_with("2.") {
            AirflowSchema::V2
        } else {
            AirflowSchema::V3
        }
    }
}

/// The families of metadata schemas the sink writes to: what differs between them is only
/// how a DAG run and a task instance are created (the seed), never what the sink writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AirflowSchema {
    /// Airflow 2.x: `dag_run.execution_date`, no `task_instance.id`.
    V2,
    /// Airflow 3.x: `dag_run.logical_date`, `task_instance.id` (a UUID).
    V3,
}

static SUPPORTED: LazyLock<Vec<AirflowRelease>> = LazyLock::new(|| {
    VERSIONS
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split('\t').map(str::trim);
            Some(AirflowRelease {
                line: fields.next()?,
                release: fields.next()?,
                kubernetes_provider: fields.next()?,
                alembic_head: fields.next()?,
            })
        })
        .collect()
});

/// Every supported release, oldest first.
pub fn supported() -> &'static [AirflowRelease] {
    &SUPPORTED
}

/// The newest supported release whose migrations end at `revision`.
pub fn release_for(revision: &str) -> Option<&'static AirflowRelease> {
    supported()
        .iter()
        .rev()
        .find(|release| release.alembic_head == revision)
}

/// `2.10.5 = 5f2621c13b39, ...`, for messages.
pub fn known_revisions() -> String {
    supported()
        .iter()
        .map(|r| format!("{} = {}", r.release, r.alembic_head))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `task_instance` columns the sink reads and writes.
pub const TASK_INSTANCE_COLUMNS: [&str; 12] = [
    "dag_id",
    "task_id",
    "run_id",
    "map_index",
    "try_number",
    "max_tries",
    "state",
    "end_date",
    "duration",
    "queued_by_job_id",
    "external_executor_id",
    "updated_at",
];

/// The `log` columns the sink writes.
pub const LOG_COLUMNS: [&str; 9] = [
    "dttm",
    "dag_id",
    "task_id",
    "map_index",
    "event",
    "run_id",
    "owner",
    "extra",
    "try_number",
];

/// The schema family of a database the list does not know, from its columns: `None` when it
/// lacks a column the sink needs.
pub fn schema_from_columns(task_instance: &[String], log: &[String]) -> Option<AirflowSchema> {
    let has = |columns: &[String], name: &str| columns.iter().any(|c| c == name);
    let complete = TASK_INSTANCE_COLUMNS.iter().all(|c| has(task_instance, c))
        && LOG_COLUMNS.iter().all(|c| has(log, c));
    complete.then(|| {
        if has(task_instance, "id") {
            AirflowSchema::V3
        } else {
            AirflowSchema::V2
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_parses_whole() {
        let data_lines = VERSIONS
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count();
        assert_eq!(
            supported().len(),
            data_lines,
            "a line of airflow-versions.tsv is malformed"
        );
        assert!(supported().iter().all(|r| r.release.starts_with(r.line)));
        assert_eq!(supported()[0].line, "2.10");
    }

    #[test]
    fn revisions_name_the_newest_release_with_them() {
        // 2.11 has no migrations of its own: its databases are 2.10's.
        assert_eq!(release_for("5f2621c13b39").map(|r| r.line), Some("2.11"));
        assert_eq!(
            release_for("509b94a1042d").map(AirflowRelease::schema),
            Some(AirflowSchema::V3)
        );
        assert_eq!(release_for("ffffffffffff"), None);
    }

    #[test]
    fn unknown_revisions_are_judged_by_their_columns() {
        let strings = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let log = strings(&LOG_COLUMNS);
        let mut ti = strings(&TASK_INSTANCE_COLUMNS);
        assert_eq!(schema_from_columns(&ti, &log), Some(AirflowSchema::V2));
        ti.push("id".into());
        assert_eq!(schema_from_columns(&ti, &log), Some(AirflowSchema::V3));
        ti.retain(|c| c != "queued_by_job_id");
        assert_eq!(schema_from_columns(&ti, &log), None);
    }
}

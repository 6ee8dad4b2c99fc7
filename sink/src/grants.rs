//! What the sink's role needs on PostgreSQL (docs/install.md, step 2), and which of it the
//! connected role holds, asked of the server's `has_*_privilege` functions without writing
//! anything (`podstream check sink`).

use std::fmt;

use sqlx::AnyPool;
use sqlx::Row as _;

use crate::db::{DbError, query_failed};

/// The tables the sink keeps beside Airflow's and creates at start when missing.
pub const OWN_TABLES: [&str; 4] = [
    "podstream_applied",
    "podstream_ti_pod",
    "podstream_ti_owner",
    "podstream_duplicate",
];

/// The columns of `task_instance` the sink writes: a fail, then a transfer. Never
/// `executor_config`, a pickle Airflow unpickles.
pub const TASK_INSTANCE_COLUMNS: [&str; 6] = [
    "state",
    "end_date",
    "duration",
    "updated_at",
    "queued_by_job_id",
    "external_executor_id",
];

/// What a privilege is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum On {
    /// The current schema (`public` unless the search path says otherwise).
    Schema,
    /// A table.
    Table(&'static str),
    /// One column of a table.
    Column(&'static str, &'static str),
    /// A sequence.
    Sequence(&'static str),
}

/// One privilege the sink uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Privilege {
    /// `SELECT`, `UPDATE`, `INSERT`, `USAGE`, `CREATE`, `DELETE`.
    pub kind: &'static str,
    /// What it is on.
    pub on: On,
    /// What the sink does with it.
    pub why: &'static str,
}

impl Privilege {
    /// The `GRANT` that gives it to `role`.
    pub fn grant(&self, role: &str) -> String {
        match &self.on {
            On::Schema => format!("GRANT {} ON SCHEMA <schema> TO {role}", self.kind),
            On::Table(table) => format!("GRANT {} ON {table} TO {role}", self.kind),
            On::Column(table, column) => {
                format!("GRANT {} ({column}) ON {table} TO {role}", self.kind)
            }
            On::Sequence(sequence) => {
                format!("GRANT {} ON SEQUENCE {sequence} TO {role}", self.kind)
            }
        }
    }

    /// The query that answers whether the current user holds it.
    fn probe(&self) -> String {
        match &self.on {
            On::Schema => format!(
                "SELECT has_schema_privilege(current_user, current_schema(), '{}')",
                self.kind
            ),
            On::Table(table) => format!(
                "SELECT has_table_privilege(current_user, '{table}', '{}')",
                self.kind
            ),
            On::Column(table, column) => format!(
                "SELECT has_column_privilege(current_user, '{table}', '{column}', '{}')",
                self.kind
            ),
            On::Sequence(sequence) => format!(
                "SELECT has_sequence_privilege(current_user, '{sequence}', '{}')",
                self.kind
            ),
        }
    }
}

impl fmt::Display for Privilege {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.on {
            On::Schema => write!(f, "{} on the current schema", self.kind),
            On::Table(table) => write!(f, "{} on {table}", self.kind),
            On::Column(table, column) => write!(f, "{} ({column}) on {table}", self.kind),
            On::Sequence(sequence) => write!(f, "{} on sequence {sequence}", self.kind),
        }
    }
}

/// Every privilege the sink uses on a database where its own tables are `existing` (the
/// four of [`OWN_TABLES`] that are there): `CREATE` on the schema while one is missing, the
/// reads and writes on those that are.
pub fn needed(existing: &[&'static str]) -> Vec<Privilege> {
    let privilege = |kind, on, why| Privilege { kind, on, why };
    let mut needed = vec![
        privilege("USAGE", On::Schema, "its tables and Airflow's"),
        privilege(
            "SELECT",
            On::Table("alembic_version"),
            "which Airflow made the schema",
        ),
        privilege("SELECT", On::Table("task_instance"), "the guard"),
    ];
    needed.extend(TASK_INSTANCE_COLUMNS.iter().map(|column| {
        privilege(
            "UPDATE",
            On::Column("task_instance", column),
            "a fail or a transfer",
        )
    }));
    needed.push(privilege("INSERT", On::Table("log"), "the audit row"));
    needed.push(privilege(
        "USAGE",
        On::Sequence("log_id_seq"),
        "the audit row's id",
    ));
    if existing.len() < OWN_TABLES.len() {
        needed.push(privilege("CREATE", On::Schema, "its own tables"));
    }
    for table in existing {
        for kind in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
            needed.push(privilege(kind, On::Table(table), "its own table"));
        }
    }
    needed
}

/// Each privilege the sink needs, and whether the role `pool` connects as holds it.
pub async fn held(pool: &AnyPool) -> Result<Vec<(Privilege, bool)>, DbError> {
    let mut existing = Vec::new();
    for table in OWN_TABLES {
        let row = sqlx::query(&format!(
            "SELECT CAST(to_regclass('{table}') IS NOT NULL AS BOOLEAN)"
        ))
        .fetch_one(pool)
        .await
        .map_err(query_failed(format!("looking up {table}")))?;
        if row
            .try_get::<bool, _>(0)
            .map_err(query_failed("reading a lookup"))?
        {
            existing.push(table);
        }
    }
    let mut answers = Vec::new();
    for privilege in needed(&existing) {
        let row = sqlx::query(&privilege.probe())
            .fetch_one(pool)
            .await
            .map_err(query_failed(format!("asking for {privilege}")))?;
        let holds = row
            .try_get::<bool, _>(0)
            .map_err(query_failed("reading a privilege"))?;
        answers.push((privilege, holds));
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's CREATE is needed exactly while one of the sink's tables is missing; the
    /// tables that are there need the four writes.
    #[test]
    fn create_while_a_table_is_missing_and_writes_on_those_there() {
        let rows: [(&[&'static str], bool, usize); 3] = [
            (&[], true, 0),
            (&["podstream_applied"], true, 4),
            (&OWN_TABLES, false, 16),
        ];
        for (existing, create, own) in rows {
            let needed = needed(existing);
            assert_eq!(
                needed
                    .iter()
                    .any(|p| p.kind == "CREATE" && p.on == On::Schema),
                create,
                "{existing:?}"
            );
            let on_own = needed
                .iter()
                .filter(|p| matches!(p.on, On::Table(t) if OWN_TABLES.contains(&t)))
                .count();
            assert_eq!(on_own, own, "{existing:?}");
            assert!(
                !needed
                    .iter()
                    .any(|p| p.on == On::Column("task_instance", "executor_config")),
                "never executor_config"
            );
        }
    }

    /// A privilege names its GRANT as docs/install.md writes it.
    #[test]
    fn a_privilege_names_its_grant() {
        let column = Privilege {
            kind: "UPDATE",
            on: On::Column("task_instance", "queued_by_job_id"),
            why: "",
        };
        assert_eq!(
            column.grant("podstream"),
            "GRANT UPDATE (queued_by_job_id) ON task_instance TO podstream"
        );
        assert_eq!(
            column.to_string(),
            "UPDATE (queued_by_job_id) on task_instance"
        );
    }
}

//! DAG runs and task instances written straight into a metadata DB, and task instances read
//! back: what `podstream demo` and the tests need around the sink. Never used by the sink.

use podstream_proto::TaskKey;
use sqlx::Row;

use crate::airflow::AirflowSchema;
use crate::db::{Database, DbError, query_failed};
use crate::dialect::{Backend, sql};

/// A task instance to seed.
#[derive(Debug, Clone)]
pub struct SeedTi<'a> {
    /// task_id.
    pub task_id: &'a str,
    /// map_index (-1 unmapped).
    pub map_index: i64,
    /// state (None = NULL).
    pub state: Option<&'a str>,
    /// try_number.
    pub try_number: i64,
    /// max_tries.
    pub max_tries: i64,
}

/// The key of the first try of unmapped task `task_id` in DAG run (`dag_id`, `run_id`): the
/// TI [`SeedTi::running`] seeds.
pub fn first_try(dag_id: &str, task_id: &str, run_id: &str) -> TaskKey {
    TaskKey {
        dag_id: dag_id.into(),
        task_id: task_id.into(),
        run_id: run_id.into(),
        map_index: -1,
        try_number: 1,
        ..TaskKey::default()
    }
}

impl<'a> SeedTi<'a> {
    /// An unmapped TI running its first try.
    pub fn running(task_id: &'a str, max_tries: i64) -> SeedTi<'a> {
        SeedTi {
            task_id,
            map_index: -1,
            state: Some("running"),
            try_number: 1,
            max_tries,
        }
    }
}

/// A task instance row as the sink leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiRow {
    /// `state` (empty for NULL).
    pub state: String,
    /// `try_number`.
    pub try_number: i64,
    /// `queued_by_job_id`, when set.
    pub queued_by_job_id: Option<i64>,
    /// `id` (Airflow 3), lowercase and hyphenated as pods carry it.
    pub id: Option<String>,
}

/// SQL inserting a running DAG run and its task instances (queued by job 1), in the dialect
/// and schema of `airflow` on `backend`.
pub fn statements(
    airflow: AirflowSchema,
    backend: Backend,
    dag_id: &str,
    run_id: &str,
    tis: &[SeedTi<'_>],
) -> Vec<String> {
    let ts = match backend {
        Backend::Postgres => "'2026-11-30 10:00:00+00'",
        Backend::Sqlite => "'2026-11-30 10:00:00.000000'",
    };
    let mut statements = vec![match airflow {
        AirflowSchema::V2 => format!(
            "INSERT INTO dag_run (dag_id, execution_date, run_id, run_type, state, clear_number) VALUES ('{dag_id}', {ts}, '{run_id}', 'manual', 'running', 0)"
        ),
        AirflowSchema::V3 => format!(
            "INSERT INTO dag_run (dag_id, logical_date, run_after, run_id, run_type, state, clear_number, span_status) VALUES ('{dag_id}', {ts}, {ts}, '{run_id}', 'manual', 'running', 0, 'not_started')"
        ),
    }];
    for ti in tis {
        // A fresh UUID, stored as SQLAlchemy's `Uuid` stores it: native on PostgreSQL, 32 hex
        // digits on SQLite.
        let id = uuid::Uuid::new_v4();
        let id = match backend {
            Backend::Postgres => id.hyphenated().to_string(),
            Backend::Sqlite => id.simple().to_string(),
        };
        let state = ti.state.map_or("NULL".to_owned(), |s| format!("'{s}'"));
        statements.push(match airflow {
            AirflowSchema::V2 => format!(
                "INSERT INTO task_instance (task_id, dag_id, run_id, map_index, state, try_number, max_tries, pool, pool_slots, start_date, queued_by_job_id) VALUES ('{}', '{dag_id}', '{run_id}', {}, {state}, {}, {}, 'default_pool', 1, {ts}, 1)",
                ti.task_id, ti.map_index, ti.try_number, ti.max_tries
            ),
            AirflowSchema::V3 => format!(
                "INSERT INTO task_instance (id, task_id, dag_id, run_id, map_index, state, try_number, max_tries, pool, pool_slots, start_date, queued_by_job_id, span_status) VALUES ('{id}', '{}', '{dag_id}', '{run_id}', {}, {state}, {}, {}, 'default_pool', 1, {ts}, 1, 'not_started')",
                ti.task_id, ti.map_index, ti.try_number, ti.max_tries
            ),
        });
    }
    statements
}

impl Database {
    /// Inserts a DAG run and its task instances (see [`statements`]).
    pub async fn seed(
        &self,
        dag_id: &str,
        run_id: &str,
        tis: &[SeedTi<'_>],
    ) -> Result<(), DbError> {
        for statement in statements(self.airflow, self.backend, dag_id, run_id, tis) {
            sqlx::query(&statement)
                .execute(&self.pool)
                .await
                .map_err(query_failed(format!("seeding: {statement}")))?;
        }
        Ok(())
    }

    /// The task instance `key` names (its try is not part of the lookup), if it exists.
    pub async fn task_instance(&self, key: &TaskKey) -> Result<Option<TiRow>, DbError> {
        let id = match self.airflow {
            AirflowSchema::V2 => "CAST(NULL AS TEXT)",
            AirflowSchema::V3 => "CAST(id AS TEXT)",
        };
        let query = sql(
            self.backend,
            &format!("SELECT COALESCE(state, ''), CAST(try_number AS BIGINT), CAST(queued_by_job_id AS BIGINT), {id}
             FROM task_instance WHERE dag_id = $1 AND task_id = $2 AND run_id = $3 AND map_index = $4"),
            0,
        );
        let row = sqlx::query(&query)
            .bind(&key.dag_id)
            .bind(&key.task_id)
            .bind(&key.run_id)
            .bind(key.map_index)
            .fetch_optional(&self.pool)
            .await
            .map_err(query_failed("reading a task instance"))?;
        row.map(|row| -> Result<TiRow, sqlx::Error> {
            Ok(TiRow {
                state: row.try_get(0)?,
                try_number: row.try_get(1)?,
                queued_by_job_id: row.try_get(2)?,
                id: row
                    .try_get::<Option<String>, _>(3)?
                    .map(crate::batch::ti_id_from_db),
            })
        })
        .transpose()
        .map_err(query_failed("reading a task instance"))
    }
}

//! Applying a batch of commands in one transaction, each under a savepoint: guarded by the TI
//! key, `try_number` and state; recorded by command id in the same transaction, so a
//! redelivery or a second `apply` changes nothing.

use podstream_proto::Command;
use podstream_proto::v1::command::Kind;
use sqlx::{AnyConnection, Connection, Row};

use crate::db::{Backend, Database, is_transient};
use crate::guard::{self, Effect, Skip, TiRow, Verdict};

/// A command and where it came from.
#[derive(Debug, Clone)]
pub struct Item {
    /// The command.
    pub command: Command,
    /// Its JetStream stream sequence, when it came from the bus.
    pub sequence: Option<u64>,
}

/// What became of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied; the name of what it did (`up_for_retry`, `failed`, `transfer`, `recorded`).
    Applied(&'static str),
    /// Left alone, for this reason.
    Skipped(Skip),
    /// Cannot ever be applied (bad data, a constraint): for the dead letters, with the reason.
    Dead(String),
}

/// Per-backend SQL: `$n` placeholders become `?n` on SQLite; `{now}` is `now()` on
/// PostgreSQL and, on SQLite, parameter `now_at`, which the caller binds last.
pub(crate) fn sql(backend: Backend, text: &str, now_at: usize) -> String {
    match backend {
        Backend::Postgres => text.replace("{now}", "now()"),
        Backend::Sqlite => text
            .replace('$', "?")
            .replace("{now}", &format!("?{now_at}")),
    }
}

/// Adoptable states and the TI key with its try: the guard every TI update carries.
const GUARD: &str =
    "dag_id = $1 AND task_id = $2 AND run_id = $3 AND map_index = $4 AND try_number = $5
                     AND state IN ('queued', 'running', 'restarting')";

/// Every statement the sink runs, in the backend's dialect, built once.
#[derive(Debug, Clone)]
pub struct Statements {
    /// The set-based statements of a batch.
    pub set: crate::batch::SetStatements,
    seen: String,
    ti: String,
    record: String,
    fail: String,
    transfer: String,
    log: String,
    upsert: String,
    duplicate: String,
}

impl Statements {
    /// The statements for a backend.
    pub fn new(b: Backend) -> Statements {
        let duration = match b {
            Backend::Postgres => "EXTRACT(EPOCH FROM (now() - start_date))",
            Backend::Sqlite => "(julianday({now}) - julianday(start_date)) * 86400.0",
        };
        let fail = format!(
            "UPDATE task_instance SET state = $6, end_date = {{now}}, duration = {duration}, updated_at = {{now}} WHERE {GUARD}"
        );
        let transfer = format!(
            "UPDATE task_instance SET queued_by_job_id = $6, external_executor_id = $7, updated_at = {{now}} WHERE {GUARD}"
        );
        Statements {
            set: crate::batch::SetStatements::new(b),
            seen: sql(b, "SELECT 1 FROM podstream_applied WHERE command_id = $1", 0),
            ti: sql(
            b,
            "SELECT state, CAST(try_number AS BIGINT), CAST(max_tries AS BIGINT) FROM task_instance
             WHERE dag_id = $1 AND task_id = $2 AND run_id = $3 AND map_index = $4",
            0,
        ),
            record: sql(
            b,
            "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at) VALUES ($1, $2, $3, {now})",
            4,
        ),
            fail: sql(b, &fail, 7),
            transfer: sql(b, &transfer, 8),
            log: sql(
                b,
                "INSERT INTO log (dttm, dag_id, task_id, map_index, event, run_id, owner, extra, try_number)
                 VALUES ({now}, $1, $2, $3, $4, $5, 'podstream', $6, $7)",
                8,
            ),
            upsert: sql(
            b,
            "INSERT INTO podstream_ti_pod (dag_id, task_id, run_id, map_index, try_number, pod_namespace, pod_name, pod_uid, owner, last_command, resource_version, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, {now})
             ON CONFLICT (dag_id, task_id, run_id, map_index) DO UPDATE SET
               try_number = excluded.try_number, pod_namespace = excluded.pod_namespace, pod_name = excluded.pod_name,
               pod_uid = excluded.pod_uid, owner = excluded.owner, last_command = excluded.last_command,
               resource_version = excluded.resource_version, updated_at = excluded.updated_at",
            12,
        ),
            duplicate: sql(
                    b,
                    "INSERT INTO podstream_duplicate (dag_id, task_id, run_id, map_index, try_number, chosen_uid, other_uid, other_name, recorded_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {now}) ON CONFLICT DO NOTHING",
                    9,
                ),
        }
    }
}

/// The `log` row of an applied command, if it writes one: its `event` and `extra`, with
/// `applied` (the new state, for a fail). Shared by the batch and the per-command paths.
pub(crate) fn log_entry(
    command: &Command,
    applied: &str,
) -> Option<(&'static str, serde_json::Value)> {
    match &command.kind {
        Some(Kind::Fail(fail)) => Some((
            "podstream_fail",
            serde_json::json!({
                "reason": fail.reason,
                "detail": fail.detail,
                "state": applied,
                "pod": command.pod.as_ref().map(|p| format!("{}/{}", p.namespace, p.name)),
                "pod_uid": command.pod.as_ref().map(|p| p.uid.clone()),
                "owner": command.owner,
                "command_id": command.id,
            }),
        )),
        Some(Kind::Transfer(transfer)) => Some((
            "podstream_transfer",
            serde_json::json!({ "from": transfer.from, "to": transfer.to, "command_id": command.id }),
        )),
        _ => None,
    }
}

/// Now, as SQLAlchemy writes a datetime into SQLite.
pub(crate) fn sqlite_now() -> String {
    sqlite_timestamp(jiff::Timestamp::now())
}

/// `at` as SQLAlchemy writes a datetime into SQLite (UTC, microseconds): text that
/// sorts as the time does.
pub(crate) fn sqlite_timestamp(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%d %H:%M:%S.%6f").to_string()
}

impl Database {
    /// Applies `items` in order in one transaction, set-based (a few statements per batch,
    /// see `batch.rs`). If the database refuses the batch for its data, it is applied again
    /// command by command to find the one at fault, which is reported `Dead` while the rest
    /// applies. A connection problem fails the whole batch, which the caller retries
    /// (nothing was committed).
    pub async fn apply_batch(&self, items: &[Item]) -> Result<Vec<Outcome>, sqlx::Error> {
        match self.apply_set(items).await {
            Ok(outcomes) => Ok(outcomes),
            Err(error) if is_transient(&error) => Err(error),
            Err(error) => {
                tracing::warn!(%error, commands = items.len(), "batch refused; applying it command by command");
                self.apply_each(items).await
            }
        }
    }

    /// The slow path: one savepoint per command, so one refused command is rolled back alone.
    pub async fn apply_each(&self, items: &[Item]) -> Result<Vec<Outcome>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let mut outcomes = Vec::with_capacity(items.len());
        for item in items {
            let mut savepoint = tx.begin().await?;
            match self.apply_one(&mut savepoint, item).await {
                Ok(Outcome::Dead(reason)) => {
                    savepoint.rollback().await?;
                    outcomes.push(Outcome::Dead(reason));
                }
                Ok(outcome) => {
                    savepoint.commit().await?;
                    outcomes.push(outcome);
                }
                Err(error) if is_transient(&error) => return Err(error),
                Err(error) => {
                    savepoint.rollback().await?;
                    outcomes.push(Outcome::Dead(format!(
                        "database refused the command: {error}"
                    )));
                }
            }
        }
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn apply_one(
        &self,
        conn: &mut AnyConnection,
        item: &Item,
    ) -> Result<Outcome, sqlx::Error> {
        let command = &item.command;
        let Some(task) = &command.task else {
            return Ok(Outcome::Dead("command without a task instance key".into()));
        };
        if command.id.is_empty() {
            return Ok(Outcome::Dead("command without an id".into()));
        }
        let b = self.backend;
        let seen = sqlx::query(&self.sql.seen)
            .bind(&command.id)
            .fetch_optional(&mut *conn)
            .await?;
        if seen.is_some() {
            return Ok(Outcome::Skipped(Skip::AlreadyApplied));
        }
        let row = sqlx::query(&self.sql.ti)
            .bind(&task.dag_id)
            .bind(&task.task_id)
            .bind(&task.run_id)
            .bind(task.map_index)
            .fetch_optional(&mut *conn)
            .await?;
        let ti = match row {
            Some(row) => Some(TiRow {
                state: row.try_get::<Option<String>, _>(0)?,
                try_number: row.try_get::<Option<i64>, _>(1)?.unwrap_or(0),
                max_tries: row.try_get::<Option<i64>, _>(2)?.unwrap_or(-1),
            }),
            None => None,
        };
        let outcome = match guard::verdict(command, ti.as_ref()) {
            Verdict::Invalid(reason) => return Ok(Outcome::Dead(reason)),
            Verdict::Skip(skip) => Outcome::Skipped(skip),
            Verdict::Apply(effect) => self.effect(conn, command, &effect).await?,
        };
        let name = match &outcome {
            Outcome::Applied(name) => *name,
            Outcome::Skipped(skip) => skip.name(),
            Outcome::Dead(_) => "dead",
        };
        let mut record = sqlx::query(&self.sql.record)
            .bind(&command.id)
            .bind(item.sequence.and_then(|s| i64::try_from(s).ok()))
            .bind(name);
        if b == Backend::Sqlite {
            record = record.bind(sqlite_now());
        }
        record.execute(&mut *conn).await?;
        Ok(outcome)
    }

    async fn effect(
        &self,
        conn: &mut AnyConnection,
        command: &Command,
        effect: &Effect,
    ) -> Result<Outcome, sqlx::Error> {
        let b = self.backend;
        let Some(task) = &command.task else {
            return Ok(Outcome::Dead("command without a task instance key".into()));
        };
        let now = sqlite_now();
        let applied = match effect {
            Effect::Fail { state } => {
                let mut query = sqlx::query(&self.sql.fail)
                    .bind(&task.dag_id)
                    .bind(&task.task_id)
                    .bind(&task.run_id)
                    .bind(task.map_index)
                    .bind(task.try_number)
                    .bind(*state);
                if b == Backend::Sqlite {
                    query = query.bind(now.clone());
                }
                if query.execute(&mut *conn).await?.rows_affected() == 0 {
                    return Ok(Outcome::Skipped(Skip::NotAdoptable(
                        "changed meanwhile".into(),
                    )));
                }
                *state
            }
            Effect::Transfer { job_id } => {
                let mut query = sqlx::query(&self.sql.transfer)
                    .bind(&task.dag_id)
                    .bind(&task.task_id)
                    .bind(&task.run_id)
                    .bind(task.map_index)
                    .bind(task.try_number)
                    .bind(*job_id)
                    .bind(job_id.to_string());
                if b == Backend::Sqlite {
                    query = query.bind(now.clone());
                }
                if query.execute(&mut *conn).await?.rows_affected() == 0 {
                    return Ok(Outcome::Skipped(Skip::NotAdoptable(
                        "changed meanwhile".into(),
                    )));
                }
                "transfer"
            }
            Effect::Record => "recorded",
        };
        if let Some((event, extra)) = log_entry(command, applied) {
            let mut log = sqlx::query(&self.sql.log)
                .bind(&task.dag_id)
                .bind(&task.task_id)
                .bind(task.map_index)
                .bind(event)
                .bind(&task.run_id)
                .bind(extra.to_string())
                .bind(task.try_number);
            if b == Backend::Sqlite {
                log = log.bind(now.clone());
            }
            log.execute(&mut *conn).await?;
        }
        self.record_pod(conn, command, &now).await?;
        Ok(Outcome::Applied(applied))
    }

    /// podstream's own record: the TI's current pod, and duplicate pods.
    async fn record_pod(
        &self,
        conn: &mut AnyConnection,
        command: &Command,
        now: &str,
    ) -> Result<(), sqlx::Error> {
        let b = self.backend;
        let (Some(task), Some(pod)) = (&command.task, &command.pod) else {
            return Ok(());
        };
        let kind = command.kind.as_ref().map_or("unknown", Kind::name);
        let mut upsert = sqlx::query(&self.sql.upsert)
            .bind(&task.dag_id)
            .bind(&task.task_id)
            .bind(&task.run_id)
            .bind(task.map_index)
            .bind(task.try_number)
            .bind(&pod.namespace)
            .bind(&pod.name)
            .bind(&pod.uid)
            .bind(&command.owner)
            .bind(kind)
            .bind(&command.resource_version);
        if b == Backend::Sqlite {
            upsert = upsert.bind(now.to_owned());
        }
        upsert.execute(&mut *conn).await?;
        if let Some(Kind::Duplicate(duplicate)) = &command.kind {
            let chosen = duplicate.chosen.as_ref().map_or("", |p| p.uid.as_str());
            for other in &duplicate.others {
                let mut insert = sqlx::query(&self.sql.duplicate)
                    .bind(&task.dag_id)
                    .bind(&task.task_id)
                    .bind(&task.run_id)
                    .bind(task.map_index)
                    .bind(task.try_number)
                    .bind(chosen)
                    .bind(&other.uid)
                    .bind(&other.name);
                if b == Backend::Sqlite {
                    insert = insert.bind(now.to_owned());
                }
                insert.execute(&mut *conn).await?;
            }
        }
        Ok(())
    }
}

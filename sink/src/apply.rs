//! Applying a batch of commands in one transaction: guarded by the TI key, `try_number` and
//! state (`guard.rs`), written by the set statements (`batch.rs`), recorded by command id in
//! the same transaction, so a redelivery or a second `apply` changes nothing.

use podstream_proto::Command;
use podstream_proto::v1::command::Kind;
use sqlx::Connection;

use crate::db::{Backend, Database, is_transient};
use crate::guard::{Effect, Skip};

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
    /// Applied, with this effect.
    Applied(Effect),
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

/// The `log` row of an applied command, if it writes one: its `event` and `extra`.
pub(crate) fn log_entry(
    command: &Command,
    effect: &Effect,
) -> Option<(&'static str, serde_json::Value)> {
    let pod = || {
        command
            .pod
            .as_ref()
            .map(|p| format!("{}/{}", p.namespace, p.name))
    };
    let pod_uid = || command.pod.as_ref().map(|p| p.uid.clone());
    match (&command.kind, effect) {
        (Some(Kind::Fail(fail)), Effect::LaunchFailed) => Some((
            "podstream_launch_failed",
            serde_json::json!({
                "reason": fail.reason,
                "detail": fail.detail,
                "container_reason": fail.provider_container_reason(),
                "left_to": "executor",
                "pod": pod(),
                "pod_uid": pod_uid(),
                "owner": command.owner,
                "command_id": command.id,
            }),
        )),
        (Some(Kind::Fail(fail)), _) => Some((
            "podstream_fail",
            serde_json::json!({
                "reason": fail.reason,
                "detail": fail.detail,
                "state": effect.name(),
                "pod": pod(),
                "pod_uid": pod_uid(),
                "owner": command.owner,
                "command_id": command.id,
            }),
        )),
        (Some(Kind::Transfer(transfer)), _) => Some((
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
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        match self.apply_set(&mut tx, items).await {
            Ok(outcomes) => {
                tx.commit().await?;
                Ok(outcomes)
            }
            Err(error) if is_transient(&error) => Err(error),
            Err(error) => {
                tx.rollback().await?;
                drop(conn);
                tracing::warn!(%error, commands = items.len(), "batch refused; applying it command by command");
                self.apply_each(items).await
            }
        }
    }

    /// The slow path: the same statements, one command under one savepoint at a time, so
    /// one refused command is rolled back alone.
    pub async fn apply_each(&self, items: &[Item]) -> Result<Vec<Outcome>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let mut outcomes = Vec::with_capacity(items.len());
        for item in items {
            let mut savepoint = tx.begin().await?;
            match self
                .apply_set(&mut savepoint, std::slice::from_ref(item))
                .await
            {
                Ok(mut one) => {
                    savepoint.commit().await?;
                    outcomes.push(one.pop().unwrap_or(Outcome::Dead("not decided".into())));
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
}

//! Applying a batch of commands in one transaction: guarded by the TI key, `try_number` and
//! state (`guard.rs`), written by the set statements (`batch.rs`), recorded by command id in
//! the same transaction, so a redelivery or a second `apply` changes nothing.

use sqlx::Connection;

use crate::db::{Database, Fault, fault_of};
use crate::item::{Item, Outcome};

impl Database {
    /// Applies `items` in order in one transaction, set-based (a few statements per batch,
    /// see `batch.rs`). If the database refuses the batch for its data, it is applied again
    /// command by command to find the one at fault, which is reported `Dead` while the rest
    /// applies. A fault of the database as a whole ([`Fault::Database`]: unreachable,
    /// read-only, a column gone) fails the whole batch, which the caller retries (nothing
    /// was committed, nothing is dead).
    pub async fn apply_batch(&self, items: &[Item]) -> Result<Vec<Outcome>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let refused = match self.apply_in_one_transaction(&mut conn, items).await {
            Ok(outcomes) => return Ok(outcomes),
            Err(error) if fault_of(&error) == Fault::Database => {
                retire(&mut conn);
                return Err(error);
            }
            Err(error) => error,
        };
        // SQLite's pool holds one connection: the slow path takes it back.
        drop(conn);
        tracing::warn!(error = %refused, commands = items.len(), "batch refused; applying it command by command");
        self.apply_each(items).await
    }

    async fn apply_in_one_transaction(
        &self,
        conn: &mut sqlx::AnyConnection,
        items: &[Item],
    ) -> Result<Vec<Outcome>, sqlx::Error> {
        let mut tx = conn.begin().await?;
        match self.apply_set(&mut tx, items).await {
            Ok(outcomes) => {
                tx.commit().await?;
                Ok(outcomes)
            }
            Err(error) => {
                // Dropped, a transaction rolls back on the connection's next use; a refused
                // batch is rolled back now, before its commands are tried one by one.
                if fault_of(&error) == Fault::Command {
                    tx.rollback().await?;
                }
                Err(error)
            }
        }
    }

    /// The slow path: the same statements, one command under one savepoint at a time, so
    /// one refused command is rolled back alone.
    pub async fn apply_each(&self, items: &[Item]) -> Result<Vec<Outcome>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let result = self.apply_each_on(&mut conn, items).await;
        if result.is_err() {
            retire(&mut conn);
        }
        result
    }

    async fn apply_each_on(
        &self,
        conn: &mut sqlx::AnyConnection,
        items: &[Item],
    ) -> Result<Vec<Outcome>, sqlx::Error> {
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
                Err(error) if fault_of(&error) == Fault::Database => return Err(error),
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

/// Closes a connection that met a fault of the database as a whole instead of pooling it, so
/// the retry connects afresh: a connection can stay stuck to what refused (a SQLite file
/// opened read-only, a server demoted to a read-only replica behind the same address).
fn retire(conn: &mut sqlx::pool::PoolConnection<sqlx::Any>) {
    conn.close_on_drop();
}

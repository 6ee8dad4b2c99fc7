//! How long `podstream_applied` remembers command ids, and the pruning of older ones.
//!
//! An id must outlive every copy of its command that the commands stream can still
//! deliver: a redelivery, and a new sink consumer, which replays the whole stream. So
//! the retention is never shorter than the stream's max age; by default it is a day
//! longer.

use std::time::Duration;

use thiserror::Error;

use crate::db::Database;
use crate::dialect::{Backend, sql, sqlite_timestamp};

/// Ids deleted per statement, so a prune never holds a long transaction.
pub const PRUNE_CHUNK: u64 = 10_000;

/// How often the sink prunes. Each prune scans `podstream_applied` once (there is no
/// index on `applied_at`, which would slow every batch's insert for an hourly delete).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Margin of the default retention past the stream's max age.
const MARGIN: Duration = Duration::from_secs(24 * 3600);

/// A retention that would let a command the stream still holds apply twice.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "an applied-id retention of {retention_hours} h is shorter than the commands stream's max age of {max_age_hours} h: \
     a command still in the stream could apply twice (use at least {max_age_hours}, or 0 to keep ids forever)"
)]
pub struct RetentionTooShort {
    /// The retention asked for, in hours.
    pub retention_hours: u64,
    /// The stream's max age, in hours.
    pub max_age_hours: u64,
}

/// The retention when none is asked for: the stream's max age plus a day.
pub fn default_applied_retention(stream_max_age: Duration) -> Duration {
    stream_max_age + MARGIN
}

/// The retention for `--applied-retention-hours`: absent → [`default_applied_retention`];
/// `0` → keep ids forever (`None`); shorter than the max age → refused.
pub fn applied_retention(
    hours: Option<u64>,
    stream_max_age: Duration,
) -> Result<Option<Duration>, RetentionTooShort> {
    match hours {
        None => Ok(Some(default_applied_retention(stream_max_age))),
        Some(0) => Ok(None),
        Some(hours) => {
            let retention = Duration::from_secs(hours.saturating_mul(3600));
            if retention < stream_max_age {
                return Err(RetentionTooShort {
                    retention_hours: hours,
                    max_age_hours: stream_max_age.as_secs().div_ceil(3600),
                });
            }
            Ok(Some(retention))
        }
    }
}

impl Database {
    /// Deletes the ids applied more than `older_than` ago, in chunks of [`PRUNE_CHUNK`];
    /// returns how many went.
    pub async fn prune_applied(&self, older_than: Duration) -> Result<u64, sqlx::Error> {
        let cutoff = jiff::SignedDuration::try_from(older_than)
            .ok()
            .and_then(|age| jiff::Timestamp::now().checked_sub(age).ok())
            .unwrap_or(jiff::Timestamp::MIN);
        // Written as the sink writes `applied_at` on SQLite, which compares the text;
        // PostgreSQL casts it.
        let cutoff = sqlite_timestamp(cutoff);
        let older = match self.backend {
            Backend::Postgres => "applied_at < CAST($1 AS TIMESTAMP) AT TIME ZONE 'UTC'",
            Backend::Sqlite => "applied_at < $1",
        };
        let text = sql(
            self.backend,
            &format!(
                "DELETE FROM podstream_applied WHERE command_id IN
                   (SELECT command_id FROM podstream_applied WHERE {older} LIMIT {PRUNE_CHUNK})"
            ),
            0,
        );
        let mut deleted = 0;
        loop {
            let chunk = sqlx::query(&text)
                .bind(&cutoff)
                .execute(&self.pool)
                .await?
                .rows_affected();
            deleted += chunk;
            if chunk < PRUNE_CHUNK {
                return Ok(deleted);
            }
        }
    }

    /// Prunes every [`PRUNE_EVERY`], the first time at once; runs until dropped. A failed
    /// prune is logged and tried again next time: it never stops the sink.
    pub async fn prune_applied_periodically(self, retention: Duration) {
        let mut every = tokio::time::interval(PRUNE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match self.prune_applied(retention).await {
                Ok(deleted) => tracing::info!(
                    deleted,
                    retention_hours = retention.as_secs() / 3600,
                    "pruned applied command ids"
                ),
                Err(error) => {
                    tracing::warn!(%error, "pruning applied command ids failed; trying again later")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEEK: Duration = Duration::from_secs(168 * 3600);

    #[test]
    fn retention_table() {
        let hours = |h: u64| Some(Duration::from_secs(h * 3600));
        type Case = (Option<u64>, Result<Option<Duration>, RetentionTooShort>);
        let cases: [Case; 5] = [
            (None, Ok(hours(192))),
            (Some(0), Ok(None)),
            (Some(168), Ok(hours(168))),
            (Some(1000), Ok(hours(1000))),
            (
                Some(24),
                Err(RetentionTooShort {
                    retention_hours: 24,
                    max_age_hours: 168,
                }),
            ),
        ];
        for (asked, want) in cases {
            assert_eq!(applied_retention(asked, WEEK), want, "asked {asked:?}");
        }
    }
}

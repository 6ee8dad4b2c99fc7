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
    "an applied-id retention of {retention_hours} h is shorter than the commands stream keeps commands ({max_age}): \
     a command still in the stream could apply twice (use at least the stream's max age, or 0 to keep ids forever)"
)]
pub struct RetentionTooShort {
    /// The retention asked for, in hours.
    pub retention_hours: u64,
    /// The stream's max age: `168 h`, or `forever`.
    pub max_age: String,
}

/// The retention for `--applied-retention-hours` and a commands stream whose max age is
/// `stream_max_age` (zero: it keeps commands forever): absent → the max age plus a day, or
/// forever (`None`) for a stream that keeps commands forever; `0` → forever; shorter than the
/// max age → refused.
pub fn applied_retention(
    hours: Option<u64>,
    stream_max_age: Duration,
) -> Result<Option<Duration>, RetentionTooShort> {
    let forever = stream_max_age.is_zero();
    match hours {
        None if forever => Ok(None),
        None => Ok(Some(stream_max_age + MARGIN)),
        Some(0) => Ok(None),
        Some(hours) => {
            let retention = Duration::from_secs(hours.saturating_mul(3600));
            if forever || retention < stream_max_age {
                return Err(RetentionTooShort {
                    retention_hours: hours,
                    max_age: if forever {
                        "forever".to_owned()
                    } else {
                        format!("{} h", stream_max_age.as_secs().div_ceil(3600))
                    },
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

    /// The retention table, for a stream kept a week and one kept forever (max age 0).
    #[test]
    fn retention_table() {
        let hours = |h: u64| Some(Duration::from_secs(h * 3600));
        let too_short = |retention_hours: u64, max_age: &str| {
            Err(RetentionTooShort {
                retention_hours,
                max_age: max_age.to_owned(),
            })
        };
        type Case = (
            Option<u64>,
            Duration,
            Result<Option<Duration>, RetentionTooShort>,
        );
        let cases: [Case; 9] = [
            (None, WEEK, Ok(hours(192))),
            (Some(0), WEEK, Ok(None)),
            (Some(168), WEEK, Ok(hours(168))),
            (Some(1000), WEEK, Ok(hours(1000))),
            (Some(24), WEEK, too_short(24, "168 h")),
            (None, Duration::ZERO, Ok(None)),
            (Some(0), Duration::ZERO, Ok(None)),
            (Some(24), Duration::ZERO, too_short(24, "forever")),
            (Some(100_000), Duration::ZERO, too_short(100_000, "forever")),
        ];
        for (asked, max_age, want) in cases {
            assert_eq!(
                applied_retention(asked, max_age),
                want,
                "asked {asked:?} for {max_age:?}"
            );
        }
    }
}

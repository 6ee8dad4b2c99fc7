//! How long podstream's tables in the metadata DB remember what the sink applied, and the
//! pruning of older rows.
//!
//! An applied id must outlive every copy of its command that the commands stream can still
//! deliver: a redelivery, and a new sink consumer, which replays the whole stream. So the
//! retention is never shorter than the stream's max age; by default it is a day longer. The
//! per-TI tables (its pod, its last transfer, its duplicates) follow the same retention: a
//! row of a TI that nothing has touched for that long guards nothing any more, except a pod
//! recorded alive, which an executor may still adopt.

use std::time::Duration;

use thiserror::Error;

use crate::db::Database;
use crate::dialect::{Backend, sql, sqlite_timestamp};

/// Ids deleted per statement, so a prune never holds a long transaction.
pub const PRUNE_CHUNK: u64 = 10_000;

/// How often the sink prunes. Each prune scans each table once (there is no index on their
/// times, which would slow every batch's writes for an hourly delete).
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

/// A table of podstream's the sink prunes, and which of its rows may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum History {
    /// `podstream_applied`: a command id per command applied.
    Applied,
    /// `podstream_ti_pod`: a TI's pod as last recorded; kept while the record says the pod
    /// is alive (an executor adopts by it), however old.
    TiPod,
    /// `podstream_ti_owner`: the sequence of the last transfer applied to a TI.
    TiOwner,
    /// `podstream_duplicate`: a TI's pods that did not drive it.
    Duplicate,
}

impl History {
    /// Every table pruned, in the order of a prune.
    pub const ALL: [History; 4] = [
        History::Applied,
        History::TiPod,
        History::TiOwner,
        History::Duplicate,
    ];

    /// The table's name.
    pub fn table(self) -> &'static str {
        match self {
            History::Applied => "podstream_applied",
            History::TiPod => "podstream_ti_pod",
            History::TiOwner => "podstream_ti_owner",
            History::Duplicate => "podstream_duplicate",
        }
    }

    fn written_at(self) -> &'static str {
        match self {
            History::Applied => "applied_at",
            History::TiPod | History::TiOwner => "updated_at",
            History::Duplicate => "recorded_at",
        }
    }

    /// What else a row must meet to go.
    fn also(self) -> &'static str {
        match self {
            // The commands after which podstream-airflow's executor adopts a TI's pod.
            History::TiPod => " AND last_command NOT IN ('running', 'transfer')",
            History::Applied | History::TiOwner | History::Duplicate => "",
        }
    }
}

/// Rows a prune deleted, per table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned(pub Vec<(History, u64)>);

impl Pruned {
    /// Rows deleted from `table`.
    pub fn of(&self, table: History) -> u64 {
        self.0
            .iter()
            .find(|(t, _)| *t == table)
            .map_or(0, |(_, n)| *n)
    }
}

impl Database {
    /// Deletes the rows of every [`History`] table written more than `older_than` ago, in
    /// chunks of [`PRUNE_CHUNK`]: no command they were written for can be delivered again.
    pub async fn prune(&self, older_than: Duration) -> Result<Pruned, sqlx::Error> {
        let cutoff = jiff::SignedDuration::try_from(older_than)
            .ok()
            .and_then(|age| jiff::Timestamp::now().checked_sub(age).ok())
            .unwrap_or(jiff::Timestamp::MIN);
        // Written as the sink writes its timestamps on SQLite, which compares the text;
        // PostgreSQL casts it.
        let cutoff = sqlite_timestamp(cutoff);
        // The row's physical id: one chunked delete for tables with any key.
        let row = match self.backend {
            Backend::Postgres => "ctid",
            Backend::Sqlite => "rowid",
        };
        let mut pruned = Pruned::default();
        for table in History::ALL {
            let (name, at, also) = (table.table(), table.written_at(), table.also());
            let older = match self.backend {
                Backend::Postgres => format!("{at} < CAST($1 AS TIMESTAMP) AT TIME ZONE 'UTC'"),
                Backend::Sqlite => format!("{at} < $1"),
            };
            let text = sql(
                self.backend,
                &format!(
                    "DELETE FROM {name} WHERE {row} IN
                       (SELECT {row} FROM {name} WHERE {older}{also} LIMIT {PRUNE_CHUNK})"
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
                    break;
                }
            }
            pruned.0.push((table, deleted));
        }
        Ok(pruned)
    }

    /// Prunes every [`PRUNE_EVERY`], the first time at once; runs until dropped. A failed
    /// prune is logged and tried again next time: it never stops the sink.
    pub async fn prune_periodically(self, retention: Duration) {
        let mut every = tokio::time::interval(PRUNE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match self.prune(retention).await {
                Ok(pruned) => tracing::info!(
                    applied = pruned.of(History::Applied),
                    ti_pod = pruned.of(History::TiPod),
                    ti_owner = pruned.of(History::TiOwner),
                    duplicate = pruned.of(History::Duplicate),
                    retention_hours = retention.as_secs() / 3600,
                    "pruned podstream's tables"
                ),
                Err(error) => {
                    tracing::warn!(%error, "pruning podstream's tables failed; trying again later")
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

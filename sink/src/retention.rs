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

/// How often the sink prunes at most. Each prune scans each table once (there is no index on
/// their times, which would slow every batch's writes for an hourly delete).
pub const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Margin of the default retention past the stream's max age.
const MARGIN: Duration = Duration::from_secs(24 * 3600);

/// A retention that would let a command the stream still holds apply twice.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "an applied-id retention of {retention} is shorter than the commands stream keeps commands ({max_age}): \
     a command still in the stream could apply twice (use at least the stream's max age, or 0 to keep ids forever)"
)]
pub struct RetentionTooShort {
    /// The retention asked for, in hours: `24 h`.
    pub retention: String,
    /// The stream's max age: `168 h`, or `forever`.
    pub max_age: String,
}

/// A duration in hours as the flags give them: `24 h`, `0.05 h`.
fn in_hours(duration: Duration) -> String {
    let hours = duration.as_secs_f64() / 3600.0;
    if hours.fract() == 0.0 {
        format!("{hours} h")
    } else {
        format!("{hours:.3} h")
    }
}

/// The retention for `--applied-retention-hours` and a commands stream whose max age is
/// `stream_max_age` (zero: it keeps commands forever): absent → the max age plus a day, or
/// forever (`None`) for a stream that keeps commands forever; zero → forever; shorter than
/// the max age → refused.
pub fn applied_retention(
    asked: Option<Duration>,
    stream_max_age: Duration,
) -> Result<Option<Duration>, RetentionTooShort> {
    let forever = stream_max_age.is_zero();
    match asked {
        None if forever => Ok(None),
        None => Ok(Some(stream_max_age + MARGIN)),
        Some(retention) if retention.is_zero() => Ok(None),
        Some(retention) => {
            if forever || retention < stream_max_age {
                return Err(RetentionTooShort {
                    retention: in_hours(retention),
                    max_age: if forever {
                        "forever".to_owned()
                    } else {
                        in_hours(stream_max_age)
                    },
                });
            }
            Ok(Some(retention))
        }
    }
}

/// How often the sink prunes for `retention`: hourly ([`PRUNE_EVERY`]), or four times per
/// retention when that is shorter (a retention of minutes), never more often than every
/// 5 s.
pub fn prune_every(retention: Duration) -> Duration {
    PRUNE_EVERY.min(retention / 4).max(Duration::from_secs(5))
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
    fn also(self) -> String {
        match self {
            // The commands after which podstream-airflow's executor adopts a TI's pod.
            History::TiPod => format!(
                " AND last_command NOT IN {}",
                crate::guard::live_pod_commands_sql()
            ),
            History::Applied | History::TiOwner | History::Duplicate => String::new(),
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

    /// Prunes every [`prune_every`] of `retention`, the first time at once; runs until
    /// dropped. A failed prune is logged and tried again next time: it never stops the sink.
    pub async fn prune_periodically(self, retention: Duration) {
        let mut every = tokio::time::interval(prune_every(retention));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match self.prune(retention).await {
                Ok(pruned) => tracing::info!(
                    applied = pruned.of(History::Applied),
                    ti_pod = pruned.of(History::TiPod),
                    ti_owner = pruned.of(History::TiOwner),
                    duplicate = pruned.of(History::Duplicate),
                    retention = %in_hours(retention),
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

    /// The retention table, for a stream kept a week, one kept forever (max age 0), and a
    /// soak's compressed one of three minutes.
    #[test]
    fn retention_table() {
        let hours = |h: u64| Some(Duration::from_secs(h * 3600));
        let too_short = |retention: &str, max_age: &str| {
            Err(RetentionTooShort {
                retention: retention.to_owned(),
                max_age: max_age.to_owned(),
            })
        };
        let minutes = |m: u64| Duration::from_secs(m * 60);
        type Case = (
            Option<Duration>,
            Duration,
            Result<Option<Duration>, RetentionTooShort>,
        );
        let cases: [Case; 12] = [
            (None, WEEK, Ok(hours(192))),
            (hours(0), WEEK, Ok(None)),
            (hours(168), WEEK, Ok(hours(168))),
            (hours(1000), WEEK, Ok(hours(1000))),
            (hours(24), WEEK, too_short("24 h", "168 h")),
            (None, Duration::ZERO, Ok(None)),
            (hours(0), Duration::ZERO, Ok(None)),
            (hours(24), Duration::ZERO, too_short("24 h", "forever")),
            (
                hours(100_000),
                Duration::ZERO,
                too_short("100000 h", "forever"),
            ),
            (Some(minutes(6)), minutes(3), Ok(Some(minutes(6)))),
            (
                Some(minutes(2)),
                minutes(3),
                too_short("0.033 h", "0.050 h"),
            ),
            (None, minutes(3), Ok(Some(minutes(3) + MARGIN))),
        ];
        for (asked, max_age, want) in cases {
            assert_eq!(
                applied_retention(asked, max_age),
                want,
                "asked {asked:?} for {max_age:?}"
            );
        }
    }

    #[test]
    fn a_short_retention_is_pruned_within_it() {
        let minutes = |m: u64| Duration::from_secs(m * 60);
        assert_eq!(prune_every(WEEK), PRUNE_EVERY);
        assert_eq!(prune_every(minutes(6)), Duration::from_secs(90));
        assert_eq!(prune_every(Duration::from_secs(8)), Duration::from_secs(5));
    }
}

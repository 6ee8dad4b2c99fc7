//! The fast path of `apply_batch`: a batch in a handful of statements rather than a handful
//! per command. Applied ids and TI rows are read at once; the guard runs in memory, in command
//! order, on rows updated as it goes (so commands for one TI keep their order); the effects are
//! written as set-based statements, in rounds that never touch one TI twice.

use std::collections::{HashMap, HashSet};

use podstream_proto::v1::command::Kind;
use podstream_proto::{Command, TaskKey};
use serde::Serialize;
use sqlx::any::AnyArguments;
use sqlx::{Any, AnyConnection, Row};

use crate::airflow::AirflowSchema;
use crate::db::{Backend, Database};
use crate::guard::{self, Effect, Skip, TiRow, Verdict};
use crate::item::{Item, Outcome};

/// A TI key without its try: dag, task, run, map index.
pub(crate) type Key = (String, String, String, i64);

/// The TI key (without the try) a command is for.
pub(crate) fn key_of(command: &Command) -> Option<Key> {
    command.task.as_ref().map(|t| {
        (
            t.dag_id.clone(),
            t.task_id.clone(),
            t.run_id.clone(),
            t.map_index,
        )
    })
}

/// The set-based statements, one fixed text each: the batch's rows travel as one JSON array
/// parameter (`json_to_recordset` on PostgreSQL, `json_each` on SQLite), so every batch
/// reuses the statement the connection prepared for the first one, and binding costs one
/// parameter whatever the batch size. On SQLite the batch's timestamp is a second parameter.
#[derive(Debug, Clone)]
pub struct SetStatements {
    applied_ids: String,
    ti_rows: String,
    fail: String,
    transfer: String,
    log: String,
    ti_pod: String,
    duplicate: String,
    applied: String,
}

/// The JSON array parameter as a table `v` with `columns` (name, PostgreSQL type).
fn json_rows(backend: Backend, columns: &[(&str, &str)]) -> String {
    let list = |each: &dyn Fn(&str, &str) -> String| {
        columns
            .iter()
            .map(|(name, ty)| each(name, ty))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match backend {
        Backend::Postgres => format!(
            "json_to_recordset($1::json) AS v({})",
            list(&|name, ty| format!("{name} {ty}"))
        ),
        Backend::Sqlite => format!(
            "(SELECT {} FROM json_each(?1)) AS v",
            list(&|name, _| format!("value ->> '{name}' AS {name}"))
        ),
    }
}

/// The columns of a TI key, as [`KeyRow`] writes them.
const KEY: [(&str, &str); 4] = [
    ("dag_id", "text"),
    ("task_id", "text"),
    ("run_id", "text"),
    ("map_index", "integer"),
];

/// `KEY` and `more`.
fn key_and(more: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    KEY.iter().chain(more).copied().collect()
}

impl SetStatements {
    /// The statements in `backend`'s dialect, for `airflow`'s schema.
    pub fn new(backend: Backend, airflow: AirflowSchema) -> SetStatements {
        let rows = |columns: &[(&str, &str)]| json_rows(backend, columns);
        let now = match backend {
            Backend::Postgres => "now()",
            Backend::Sqlite => "?2",
        };
        let duration = match backend {
            Backend::Postgres => {
                "EXTRACT(EPOCH FROM (now() - task_instance.start_date))".to_owned()
            }
            Backend::Sqlite => {
                format!("(julianday({now}) - julianday(task_instance.start_date)) * 86400.0")
            }
        };
        // SQLite: the unary `+` keeps the planner off the state index, which it would
        // otherwise walk as the outer loop (every running TI, each against every row).
        let state = match backend {
            Backend::Postgres => "task_instance.state",
            Backend::Sqlite => "+task_instance.state",
        };
        // Airflow 3: a command whose pod names the TI's UUID moves only the TI with that id
        // (PostgreSQL stores a native uuid; SQLAlchemy writes 32 hex digits into SQLite).
        let same_instance = match (airflow, backend) {
            (AirflowSchema::V2, _) => "",
            (AirflowSchema::V3, Backend::Postgres) => {
                "AND (v.ti_id IS NULL OR task_instance.id = CAST(v.ti_id AS uuid))"
            }
            (AirflowSchema::V3, Backend::Sqlite) => {
                "AND (v.ti_id IS NULL OR lower(replace(task_instance.id, '-', '')) = v.ti_id)"
            }
        };
        let guarded = |set: String, more: &[(&'static str, &'static str)]| {
            format!(
                "UPDATE task_instance SET {set}
                 FROM {} WHERE task_instance.dag_id = v.dag_id AND task_instance.task_id = v.task_id
                   AND task_instance.run_id = v.run_id AND task_instance.map_index = v.map_index
                   AND task_instance.try_number = v.try_number
                   AND {state} IN ('queued', 'running', 'restarting') {same_instance}
                 RETURNING task_instance.dag_id, task_instance.task_id, task_instance.run_id,
                   CAST(task_instance.map_index AS BIGINT)",
                rows(&key_and(more))
            )
        };
        let ti_id = match airflow {
            AirflowSchema::V2 => "CAST(NULL AS TEXT)",
            AirflowSchema::V3 => "CAST(t.id AS TEXT)",
        };
        SetStatements {
            applied_ids: match backend {
                // One primary-key probe per id whatever the statistics say: the `LIMIT`
                // keeps PostgreSQL from turning the lookup into a join it may plan as a scan
                // of the table (which only grows) while its statistics still call it empty.
                Backend::Postgres => format!(
                    "SELECT a.command_id FROM {} CROSS JOIN LATERAL
                       (SELECT command_id FROM podstream_applied WHERE command_id = v.id LIMIT 1) a",
                    rows(&[("id", "text")])
                ),
                Backend::Sqlite => format!(
                    "SELECT command_id FROM podstream_applied WHERE command_id IN (SELECT v.id FROM {})",
                    rows(&[("id", "text")])
                ),
            },
            // A join with the keys as a table lets both databases use the TI key's index.
            ti_rows: format!(
                "SELECT t.dag_id, t.task_id, t.run_id, CAST(t.map_index AS BIGINT), t.state,
                        CAST(t.try_number AS BIGINT), CAST(t.max_tries AS BIGINT), {ti_id}
                 FROM {} JOIN task_instance t ON t.dag_id = v.dag_id AND t.task_id = v.task_id
                   AND t.run_id = v.run_id AND t.map_index = v.map_index",
                rows(&KEY)
            ),
            fail: guarded(
                format!(
                    "state = v.new_state, end_date = {now}, duration = {duration}, updated_at = {now}"
                ),
                &[
                    ("try_number", "integer"),
                    ("ti_id", "text"),
                    ("new_state", "text"),
                ],
            ),
            transfer: guarded(
                format!(
                    "queued_by_job_id = v.job_id, external_executor_id = v.executor_id, updated_at = {now}"
                ),
                &[
                    ("try_number", "integer"),
                    ("ti_id", "text"),
                    ("job_id", "integer"),
                    ("executor_id", "text"),
                ],
            ),
            log: format!(
                "INSERT INTO log (dttm, dag_id, task_id, map_index, event, run_id, owner, extra, try_number)
                 SELECT {now}, v.dag_id, v.task_id, v.map_index, v.event, v.run_id, 'podstream', v.extra, v.try_number
                 FROM {}",
                rows(&key_and(&[
                    ("try_number", "integer"),
                    ("event", "text"),
                    ("extra", "text"),
                ]))
            ),
            // `WHERE true`: SQLite's parser needs it between a SELECT and ON CONFLICT.
            ti_pod: format!(
                "INSERT INTO podstream_ti_pod (dag_id, task_id, run_id, map_index, try_number, pod_namespace, pod_name, pod_uid, owner, last_command, resource_version, updated_at)
                 SELECT v.dag_id, v.task_id, v.run_id, v.map_index, v.try_number, v.pod_namespace, v.pod_name, v.pod_uid, v.owner, v.last_command, v.resource_version, {now}
                 FROM {} WHERE true
                 ON CONFLICT (dag_id, task_id, run_id, map_index) DO UPDATE SET
                   try_number = excluded.try_number, pod_namespace = excluded.pod_namespace, pod_name = excluded.pod_name,
                   pod_uid = excluded.pod_uid, owner = excluded.owner, last_command = excluded.last_command,
                   resource_version = excluded.resource_version, updated_at = excluded.updated_at",
                rows(&key_and(&[
                    ("try_number", "integer"),
                    ("pod_namespace", "text"),
                    ("pod_name", "text"),
                    ("pod_uid", "text"),
                    ("owner", "text"),
                    ("last_command", "text"),
                    ("resource_version", "text"),
                ]))
            ),
            duplicate: format!(
                "INSERT INTO podstream_duplicate (dag_id, task_id, run_id, map_index, try_number, chosen_uid, other_uid, other_name, recorded_at)
                 SELECT v.dag_id, v.task_id, v.run_id, v.map_index, v.try_number, v.chosen_uid, v.other_uid, v.other_name, {now}
                 FROM {} WHERE true ON CONFLICT DO NOTHING",
                rows(&key_and(&[
                    ("try_number", "integer"),
                    ("chosen_uid", "text"),
                    ("other_uid", "text"),
                    ("other_name", "text"),
                ]))
            ),
            applied: format!(
                "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at)
                 SELECT v.id, v.sequence, v.outcome, {now} FROM {}",
                rows(&[("id", "text"), ("sequence", "bigint"), ("outcome", "text")])
            ),
        }
    }

    /// Every statement by name: `applied_ids`, `ti_rows`, `fail`, ...
    pub fn named(&self) -> [(&'static str, &str); 8] {
        [
            ("applied_ids", &self.applied_ids),
            ("ti_rows", &self.ti_rows),
            ("fail", &self.fail),
            ("transfer", &self.transfer),
            ("log", &self.log),
            ("ti_pod", &self.ti_pod),
            ("duplicate", &self.duplicate),
            ("applied", &self.applied),
        ]
    }
}

/// A TI key as a JSON row.
#[derive(Serialize)]
struct KeyRow<'a> {
    dag_id: &'a str,
    task_id: &'a str,
    run_id: &'a str,
    map_index: i64,
}

impl<'a> KeyRow<'a> {
    fn of((dag_id, task_id, run_id, map_index): &'a Key) -> KeyRow<'a> {
        KeyRow {
            dag_id,
            task_id,
            run_id,
            map_index: *map_index,
        }
    }

    fn of_task(task: &'a TaskKey) -> KeyRow<'a> {
        KeyRow {
            dag_id: &task.dag_id,
            task_id: &task.task_id,
            run_id: &task.run_id,
            map_index: task.map_index,
        }
    }
}

/// A row of a guarded TI update: the key and try (and the TI's UUID when the pod names it),
/// then what the update sets.
#[derive(Serialize)]
struct UpdateRow<'a> {
    #[serde(flatten)]
    key: KeyRow<'a>,
    try_number: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    ti_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    new_state: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    executor_id: Option<String>,
}

/// A `log` row.
#[derive(Serialize)]
struct LogRow<'a> {
    #[serde(flatten)]
    key: KeyRow<'a>,
    try_number: i64,
    event: &'a str,
    extra: String,
}

/// A `podstream_ti_pod` row.
#[derive(Serialize)]
struct TiPodRow<'a> {
    #[serde(flatten)]
    key: KeyRow<'a>,
    try_number: i64,
    pod_namespace: &'a str,
    pod_name: &'a str,
    pod_uid: &'a str,
    owner: &'a str,
    last_command: &'a str,
    resource_version: &'a str,
}

/// A `podstream_duplicate` row.
#[derive(Serialize)]
struct DuplicateRow<'a> {
    #[serde(flatten)]
    key: KeyRow<'a>,
    try_number: i64,
    chosen_uid: &'a str,
    other_uid: &'a str,
    other_name: &'a str,
}

/// A command id to look up in `podstream_applied`.
#[derive(Serialize)]
struct IdRow<'a> {
    id: &'a str,
}

/// A `podstream_applied` row.
#[derive(Serialize)]
struct AppliedRow<'a> {
    id: &'a str,
    sequence: Option<i64>,
    outcome: &'a str,
}

/// One of the set statements with its rows bound, and on SQLite the batch's timestamp for
/// the statements that write one (`?2`).
fn set_query<'q, R: Serialize>(
    backend: Backend,
    text: &'q str,
    rows: &[R],
    now: Option<&str>,
) -> Result<sqlx::query::Query<'q, Any, AnyArguments<'q>>, sqlx::Error> {
    let json = serde_json::to_string(rows).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let query = sqlx::query::<Any>(text).bind(json);
    Ok(match (backend, now) {
        (Backend::Sqlite, Some(now)) => query.bind(now.to_owned()),
        _ => query,
    })
}

/// The four key columns a statement returns or selects first.
fn key_from(row: &sqlx::any::AnyRow) -> Result<Key, sqlx::Error> {
    Ok((
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    ))
}

/// A TI update waiting for its round.
struct Update {
    index: usize,
    key: Key,
    try_number: i64,
    /// The TI UUID the pod names, as the update compares it ([`ti_id_param`]).
    ti_id: Option<String>,
    effect: Effect,
}

/// The TI UUID a command's pod names, in the form the update compares: 32 lowercase hex
/// digits on SQLite (as SQLAlchemy stores it), hyphenated on PostgreSQL.
fn ti_id_param(backend: Backend, task: &TaskKey) -> Option<String> {
    let id = task.task_instance_id.as_str();
    (!id.is_empty()).then(|| match backend {
        Backend::Postgres => id.to_owned(),
        Backend::Sqlite => id.replace('-', "").to_ascii_lowercase(),
    })
}

/// A TI UUID as the database returned it (PostgreSQL: hyphenated; SQLite: as Airflow wrote
/// it, 32 hex digits), in the pods' form: lowercase, hyphenated. Kept as it is when it does
/// not read as a UUID, so that it matches no pod.
pub(crate) fn ti_id_from_db(id: String) -> String {
    uuid::Uuid::try_parse(&id).map_or(id, |u| u.hyphenated().to_string())
}

impl Database {
    /// Applies `items` in order on `conn`, inside the caller's transaction.
    pub(crate) async fn apply_set(
        &self,
        tx: &mut AnyConnection,
        items: &[Item],
    ) -> Result<Vec<Outcome>, sqlx::Error> {
        let now = crate::db::sqlite_now();
        let applied = self.applied_ids(tx, items).await?;
        let mut rows = self.ti_rows(tx, items).await?;
        // Effects that write a `log` row and leave the TI as it is.
        let mut logged_only = Vec::new();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; items.len()];
        let mut seen: HashSet<&str> = HashSet::new();
        let mut round: Vec<Update> = Vec::new();
        let mut round_keys: HashSet<Key> = HashSet::new();
        for (index, item) in items.iter().enumerate() {
            let command = &item.command;
            if command.id.is_empty() || command.task.is_none() {
                outcomes[index] = Some(Outcome::Dead(
                    "command without an id or task instance key".into(),
                ));
                continue;
            }
            if applied.contains(&command.id) || !seen.insert(command.id.as_str()) {
                outcomes[index] = Some(Outcome::Skipped(Skip::AlreadyApplied));
                continue;
            }
            let Some(key) = key_of(command) else { continue };
            match guard::verdict(command, rows.get(&key), &self.policy) {
                Verdict::Invalid(reason) => outcomes[index] = Some(Outcome::Dead(reason)),
                Verdict::Skip(skip) => outcomes[index] = Some(Outcome::Skipped(skip)),
                Verdict::Apply(Effect::Record) => {
                    outcomes[index] = Some(Outcome::Applied(Effect::Record))
                }
                Verdict::Apply(effect @ (Effect::LaunchFailed | Effect::LeftToExecutor)) => {
                    outcomes[index] = Some(Outcome::Applied(effect.clone()));
                    logged_only.push((index, effect));
                }
                Verdict::Apply(effect) => {
                    if !round_keys.insert(key.clone()) {
                        round_keys.clear();
                        round_keys.insert(key.clone());
                        self.run_round(tx, items, std::mem::take(&mut round), &mut outcomes, &now)
                            .await?;
                    }
                    if let (Effect::Fail { state }, Some(row)) = (&effect, rows.get_mut(&key)) {
                        row.state = Some(state.name().to_owned());
                    }
                    let task = command.task.as_ref();
                    round.push(Update {
                        index,
                        key,
                        try_number: task.map_or(0, |t| t.try_number),
                        ti_id: task.and_then(|t| ti_id_param(self.backend, t)),
                        effect,
                    });
                }
            }
        }
        self.run_round(tx, items, round, &mut outcomes, &now)
            .await?;
        self.insert_logs(tx, items, &logged_only, &now).await?;
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Dead("not decided".into())))
            .collect();
        let applied_indexes: Vec<usize> = (0..items.len())
            .filter(|i| matches!(outcomes.get(*i), Some(Outcome::Applied(_))))
            .collect();
        self.record_pods(tx, items, &outcomes, &applied_indexes, &now)
            .await?;
        self.record_applied(tx, items, &outcomes, &now).await?;
        Ok(outcomes)
    }

    async fn applied_ids(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
    ) -> Result<HashSet<String>, sqlx::Error> {
        let ids: Vec<IdRow> = items.iter().map(|i| IdRow { id: &i.command.id }).collect();
        let query = set_query(self.backend, &self.sql.applied_ids, &ids, None)?;
        let mut found = HashSet::new();
        for row in query.fetch_all(&mut *conn).await? {
            found.insert(row.try_get::<String, _>(0)?);
        }
        Ok(found)
    }

    async fn ti_rows(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
    ) -> Result<HashMap<Key, TiRow>, sqlx::Error> {
        let keys: Vec<Key> = {
            let mut unique: Vec<Key> = items.iter().filter_map(|i| key_of(&i.command)).collect();
            unique.sort();
            unique.dedup();
            unique
        };
        let key_rows: Vec<KeyRow> = keys.iter().map(KeyRow::of).collect();
        let query = set_query(self.backend, &self.sql.ti_rows, &key_rows, None)?;
        let mut rows = HashMap::new();
        for row in query.fetch_all(&mut *conn).await? {
            rows.insert(
                key_from(&row)?,
                TiRow {
                    state: row.try_get::<Option<String>, _>(4)?,
                    try_number: row.try_get::<Option<i64>, _>(5)?.unwrap_or(0),
                    max_tries: row.try_get::<Option<i64>, _>(6)?.unwrap_or(-1),
                    id: row.try_get::<Option<String>, _>(7)?.map(ti_id_from_db),
                },
            );
        }
        Ok(rows)
    }

    /// Runs a guarded update over `rows`; returns the keys it changed.
    async fn guarded_update(
        &self,
        conn: &mut AnyConnection,
        text: &str,
        rows: &[UpdateRow<'_>],
        now: &str,
    ) -> Result<Vec<Key>, sqlx::Error> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let query = set_query(self.backend, text, rows, Some(now))?;
        query
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(key_from)
            .collect()
    }

    /// Runs one of the writing set statements over `rows`; nothing when there are none.
    async fn write<R: Serialize>(
        &self,
        conn: &mut AnyConnection,
        text: &str,
        rows: &[R],
        now: &str,
    ) -> Result<(), sqlx::Error> {
        if !rows.is_empty() {
            set_query(self.backend, text, rows, Some(now))?
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// One round of TI updates (no TI twice), with their `log` rows. Updates the guard in the
    /// database refused (the TI changed meanwhile) become skips.
    async fn run_round(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
        round: Vec<Update>,
        outcomes: &mut [Option<Outcome>],
        now: &str,
    ) -> Result<(), sqlx::Error> {
        let mut fails = Vec::new();
        let mut transfers = Vec::new();
        for update in &round {
            let row = |new_state, job_id: Option<i64>| UpdateRow {
                key: KeyRow::of(&update.key),
                try_number: update.try_number,
                ti_id: update.ti_id.as_deref(),
                new_state,
                job_id,
                executor_id: job_id.map(|j| j.to_string()),
            };
            match update.effect {
                Effect::Fail { state } => fails.push(row(Some(state.name()), None)),
                Effect::Transfer { job_id } => transfers.push(row(None, Some(job_id))),
                Effect::LaunchFailed | Effect::LeftToExecutor | Effect::Record => {}
            }
        }
        let mut done: HashSet<Key> = HashSet::new();
        done.extend(
            self.guarded_update(conn, &self.sql.fail, &fails, now)
                .await?,
        );
        done.extend(
            self.guarded_update(conn, &self.sql.transfer, &transfers, now)
                .await?,
        );
        let mut logged = Vec::new();
        for update in &round {
            if !done.contains(&update.key) {
                outcomes[update.index] = Some(Outcome::Skipped(Skip::NotAdoptable(
                    "changed meanwhile".into(),
                )));
                continue;
            }
            outcomes[update.index] = Some(Outcome::Applied(update.effect.clone()));
            logged.push((update.index, update.effect.clone()));
        }
        self.insert_logs(conn, items, &logged, now).await
    }

    async fn insert_logs(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
        applied: &[(usize, Effect)],
        now: &str,
    ) -> Result<(), sqlx::Error> {
        let rows: Vec<LogRow> = applied
            .iter()
            .filter_map(|(i, effect)| items.get(*i).map(|item| (item, effect)))
            .filter_map(|(item, effect)| {
                let command = &item.command;
                let task = command.task.as_ref()?;
                let (event, extra) = log_entry(command, effect)?;
                Some(LogRow {
                    key: KeyRow::of_task(task),
                    try_number: task.try_number,
                    event,
                    extra: extra.to_string(),
                })
            })
            .collect();
        self.write(conn, &self.sql.log, &rows, now).await
    }

    /// The TI's current pod (the batch's last applied command per TI wins) and duplicate
    /// pods, for the commands at `indexes` that applied.
    async fn record_pods(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
        outcomes: &[Outcome],
        indexes: &[usize],
        now: &str,
    ) -> Result<(), sqlx::Error> {
        let mut latest: HashMap<Key, usize> = HashMap::new();
        for index in indexes {
            if let (Some(item), Some(Outcome::Applied(_))) =
                (items.get(*index), outcomes.get(*index))
                && let Some(key) = key_of(&item.command)
            {
                latest.insert(key, *index);
            }
        }
        let mut chosen: Vec<usize> = latest.into_values().collect();
        chosen.sort_unstable();
        let pods: Vec<TiPodRow> = chosen
            .iter()
            .filter_map(|i| items.get(*i))
            .filter_map(|item| {
                let c = &item.command;
                let (task, pod) = (c.task.as_ref()?, c.pod.as_ref()?);
                Some(TiPodRow {
                    key: KeyRow::of_task(task),
                    try_number: task.try_number,
                    pod_namespace: &pod.namespace,
                    pod_name: &pod.name,
                    pod_uid: &pod.uid,
                    owner: &c.owner,
                    last_command: c.kind.as_ref().map_or("unknown", Kind::name),
                    resource_version: &c.resource_version,
                })
            })
            .collect();
        self.write(conn, &self.sql.ti_pod, &pods, now).await?;
        let duplicates: Vec<DuplicateRow> = indexes
            .iter()
            .filter(|i| matches!(outcomes.get(**i), Some(Outcome::Applied(_))))
            .filter_map(|i| items.get(*i))
            .filter_map(|item| {
                let c = &item.command;
                let task = c.task.as_ref()?;
                let Some(Kind::Duplicate(d)) = &c.kind else {
                    return None;
                };
                let chosen_uid = d.chosen.as_ref().map_or("", |p| p.uid.as_str());
                Some(d.others.iter().map(move |other| DuplicateRow {
                    key: KeyRow::of_task(task),
                    try_number: task.try_number,
                    chosen_uid,
                    other_uid: &other.uid,
                    other_name: &other.name,
                }))
            })
            .flatten()
            .collect();
        self.write(conn, &self.sql.duplicate, &duplicates, now)
            .await
    }

    /// Every decided command id, with what became of it, in the batch's transaction.
    async fn record_applied(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
        outcomes: &[Outcome],
        now: &str,
    ) -> Result<(), sqlx::Error> {
        let rows: Vec<AppliedRow> = items
            .iter()
            .zip(outcomes)
            .filter_map(|(item, outcome)| match outcome {
                Outcome::Applied(effect) => Some((item, effect.name())),
                Outcome::Skipped(Skip::AlreadyApplied) | Outcome::Dead(_) => None,
                Outcome::Skipped(skip) => Some((item, skip.name())),
            })
            .map(|(item, name)| AppliedRow {
                id: &item.command.id,
                sequence: item.sequence.and_then(|s| i64::try_from(s).ok()),
                outcome: name,
            })
            .collect();
        self.write(conn, &self.sql.applied, &rows, now).await
    }
}

/// The `log` row of an applied command, if it writes one: its `event` and `extra`.
fn log_entry(command: &Command, effect: &Effect) -> Option<(&'static str, serde_json::Value)> {
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

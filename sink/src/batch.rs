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

use crate::db::Database;
use crate::dialect::{Backend, sqlite_now};
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

/// Whether `command` says its pod lives on (`running`, `transfer`): what binds a try to it,
/// as `podstream_ti_pod`'s `last_command` does in the statement.
fn keeps_pod_alive(command: &Command) -> bool {
    matches!(command.kind, Some(Kind::Running(_) | Kind::Transfer(_)))
}

/// Whether a recorded `last_command` says its pod lives on: [`keeps_pod_alive`]'s kinds, by
/// the names `podstream_ti_pod` stores (and its statement's `WHERE` lists).
fn names_a_live_pod(last_command: &str) -> bool {
    guard::LIVE_POD_COMMANDS.contains(&last_command)
}

/// Binds an unbound try to the pod of an applied `running` or `transfer` in the batch, as the
/// batch's `podstream_ti_pod` write will: later commands of the batch are judged by it.
fn bind_first_running(row: Option<&mut guard::TiRow>, command: &Command) {
    if let (Some(row), Some(pod), true) = (row, command.pod.as_ref(), keeps_pod_alive(command))
        && row.recorded_pod.is_none()
    {
        row.recorded_pod = Some(guard::RecordedPod::of(pod));
    }
}

/// Whether `bound`, recorded first, keeps its try's binding against `next`: it ran (or moved)
/// and `next` names another pod of the same try.
fn binds_against(bound: &Command, next: &Command) -> bool {
    let alive = keeps_pod_alive(bound);
    let same_try =
        bound.task.as_ref().map(|t| t.try_number) == next.task.as_ref().map(|t| t.try_number);
    let same_pod = bound.pod.as_ref().map(|p| (&p.namespace, &p.name))
        == next.pod.as_ref().map(|p| (&p.namespace, &p.name));
    alive && same_try && !same_pod
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

/// A `podstream_ti_owner` row: the owner a transfer gave, at its commands-stream sequence.
#[derive(Serialize)]
struct TiOwnerRow<'a> {
    #[serde(flatten)]
    key: KeyRow<'a>,
    owner: &'a str,
    sequence: i64,
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
        let now = sqlite_now();
        // The TI rows first: on PostgreSQL they are locked, so the applied ids read next
        // include what another sink committed on these TIs meanwhile.
        let mut rows = self.ti_rows(tx, items).await?;
        let applied = self.applied_ids(tx, items).await?;
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
            match guard::verdict(command, item.sequence, rows.get(&key), &self.policy) {
                Verdict::Invalid(reason) => outcomes[index] = Some(Outcome::Dead(reason)),
                Verdict::Skip(skip) => outcomes[index] = Some(Outcome::Skipped(skip)),
                Verdict::Apply(Effect::Record) => {
                    bind_first_running(rows.get_mut(&key), command);
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
                    if let Effect::Transfer { .. } = effect {
                        bind_first_running(rows.get_mut(&key), command);
                    }
                    if let Some(row) = rows.get_mut(&key) {
                        match &effect {
                            Effect::Fail { state } => row.state = Some(state.name().to_owned()),
                            Effect::Transfer { .. } if item.sequence.is_some() => {
                                row.last_transfer = item.sequence.max(row.last_transfer);
                            }
                            _ => {}
                        }
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
                    last_transfer: None,
                    hostname: row.try_get::<Option<String>, _>(8)?,
                    recorded_pod: match (
                        row.try_get::<Option<String>, _>(9)?,
                        row.try_get::<Option<String>, _>(10)?,
                        row.try_get::<Option<String>, _>(11)?,
                    ) {
                        (Some(namespace), Some(name), last_command) => Some(guard::RecordedPod {
                            namespace,
                            name,
                            alive: last_command.as_deref().is_some_and(names_a_live_pod),
                        }),
                        _ => None,
                    },
                },
            );
        }
        let query = set_query(self.backend, &self.sql.last_transfers, &key_rows, None)?;
        for row in query.fetch_all(&mut *conn).await? {
            if let Some(ti) = rows.get_mut(&key_from(&row)?) {
                ti.last_transfer = u64::try_from(row.try_get::<i64, _>(4)?).ok();
            }
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

    /// The TI's pod (the batch's last applied command per TI, unless an earlier one of
    /// another pod of the try ran: the try stays bound to its first pod that ran, here and in
    /// the statement) and duplicate pods, for the commands at `indexes` that applied.
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
                let bound_elsewhere = latest
                    .get(&key)
                    .and_then(|at| items.get(*at))
                    .is_some_and(|known| binds_against(&known.command, &item.command));
                if !bound_elsewhere {
                    latest.insert(key, *index);
                }
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
        // Per TI the newest transfer applied (one row per key: an upsert may not touch a
        // row twice).
        let mut newest: HashMap<Key, TiOwnerRow> = HashMap::new();
        for index in indexes {
            let (Some(item), Some(Outcome::Applied(Effect::Transfer { .. }))) =
                (items.get(*index), outcomes.get(*index))
            else {
                continue;
            };
            let (Some(task), Some(key), Some(sequence)) = (
                item.command.task.as_ref(),
                key_of(&item.command),
                item.sequence.and_then(|s| i64::try_from(s).ok()),
            ) else {
                continue;
            };
            let row = TiOwnerRow {
                key: KeyRow::of_task(task),
                owner: &item.command.owner,
                sequence,
            };
            match newest.get(&key) {
                Some(known) if known.sequence >= sequence => {}
                _ => {
                    newest.insert(key, row);
                }
            }
        }
        let owners: Vec<TiOwnerRow> = newest.into_values().collect();
        self.write(conn, &self.sql.ti_owner, &owners, now).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use podstream_proto::v1::{Completed, Duplicate, Fail, Lost, Running, Transfer};

    #[test]
    fn a_recorded_name_lives_exactly_when_its_kind_keeps_the_pod_alive() {
        let kinds = [
            Kind::Fail(Fail::default()),
            Kind::Completed(Completed::default()),
            Kind::Running(Running::default()),
            Kind::Lost(Lost::default()),
            Kind::Transfer(Transfer::default()),
            Kind::Duplicate(Duplicate::default()),
        ];
        for kind in kinds {
            let command = Command {
                kind: Some(kind.clone()),
                ..Command::default()
            };
            assert_eq!(
                names_a_live_pod(kind.name()),
                keeps_pod_alive(&command),
                "{}",
                kind.name()
            );
        }
    }
}

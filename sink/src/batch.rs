//! The fast path of `apply_batch`: a batch in a handful of statements rather than a handful
//! per command. Applied ids and TI rows are read at once; the guard runs in memory, in command
//! order, on rows updated as it goes (so commands for one TI keep their order); the effects are
//! written as set-based statements, in rounds that never touch one TI twice.

use std::collections::{HashMap, HashSet};

use podstream_proto::Command;
use podstream_proto::v1::command::Kind;
use sqlx::any::AnyArguments;
use sqlx::{Any, AnyConnection, Arguments, Connection, Row};

use crate::apply::{Item, Outcome, log_entry, sqlite_now};
use crate::db::{Backend, Database};
use crate::guard::{self, Effect, Skip, TiRow, Verdict};

/// Rows per multi-row statement (well under both databases' parameter limits).
const ROWS: usize = 500;

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

/// A statement with numbered placeholders, built row by row.
struct Multi {
    backend: Backend,
    args: AnyArguments<'static>,
    next: usize,
}

impl Multi {
    fn new(backend: Backend) -> Multi {
        Multi {
            backend,
            args: AnyArguments::default(),
            next: 1,
        }
    }

    /// The next placeholder. SQLite gets anonymous `?`s (every statement here writes its
    /// placeholders in the order it binds them): with numbered ones, binding looks each name
    /// up in a list as long as the statement, which made binding a 500-row statement
    /// quadratic and a fifth of the sink's time.
    fn placeholder(&mut self) -> String {
        let n = self.next;
        self.next += 1;
        match self.backend {
            Backend::Postgres => format!("${n}"),
            Backend::Sqlite => "?".to_owned(),
        }
    }

    fn text(&mut self, value: &str) -> String {
        let _ = self.args.add(value.to_owned());
        self.placeholder()
    }

    fn int(&mut self, value: i64) -> String {
        let _ = self.args.add(value);
        self.placeholder()
    }

    fn opt_int(&mut self, value: Option<i64>) -> String {
        let _ = self.args.add(value);
        self.placeholder()
    }

    /// A TI key and try as five placeholders.
    fn key(&mut self, (dag_id, task_id, run_id, map_index): &Key, try_number: i64) -> String {
        format!(
            "{}, {}, {}, {}, {}",
            self.text(dag_id),
            self.text(task_id),
            self.text(run_id),
            self.int(*map_index),
            self.int(try_number)
        )
    }

    /// `now()` on PostgreSQL; on SQLite the batch's timestamp as a literal (anonymous
    /// placeholders cannot be reused, and the text is our own clock's: digits and separators).
    fn now(&mut self, sqlite_now: &str) -> String {
        match self.backend {
            Backend::Postgres => "now()".into(),
            Backend::Sqlite => format!("'{sqlite_now}'"),
        }
    }
}

/// Updates the TIs listed in `values` (their key, try, then `columns`) with `set`, under the
/// guard (same try, adoptable state); returns the keys it changed.
async fn guarded_update(
    conn: &mut AnyConnection,
    m: Multi,
    columns: &str,
    values: &[String],
    set: &str,
) -> Result<Vec<Key>, sqlx::Error> {
    let text = format!(
        "WITH v(dag_id, task_id, run_id, map_index, try_number, {columns}) AS (VALUES {})
         UPDATE task_instance SET {set}
         FROM v WHERE task_instance.dag_id = v.dag_id AND task_instance.task_id = v.task_id
           AND task_instance.run_id = v.run_id AND task_instance.map_index = v.map_index
           AND task_instance.try_number = v.try_number
           AND task_instance.state IN ('queued', 'running', 'restarting')
         RETURNING task_instance.dag_id, task_instance.task_id, task_instance.run_id, CAST(task_instance.map_index AS BIGINT)",
        values.join(", ")
    );
    let mut changed = Vec::new();
    for row in sqlx::query_with::<Any, _>(&text, m.args)
        .fetch_all(&mut *conn)
        .await?
    {
        changed.push((
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
        ));
    }
    Ok(changed)
}

/// A TI update waiting for its round.
struct Update {
    index: usize,
    key: Key,
    try_number: i64,
    effect: Effect,
}

impl Database {
    pub(crate) async fn apply_set(&self, items: &[Item]) -> Result<Vec<Outcome>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let now = sqlite_now();
        let applied = self.applied_ids(&mut tx, items).await?;
        let mut rows = self.ti_rows(&mut tx, items).await?;
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
            match guard::verdict(command, rows.get(&key)) {
                Verdict::Invalid(reason) => outcomes[index] = Some(Outcome::Dead(reason)),
                Verdict::Skip(skip) => outcomes[index] = Some(Outcome::Skipped(skip)),
                Verdict::Apply(Effect::Record) => {
                    outcomes[index] = Some(Outcome::Applied("recorded"))
                }
                Verdict::Apply(effect) => {
                    if !round_keys.insert(key.clone()) {
                        round_keys.clear();
                        round_keys.insert(key.clone());
                        self.run_round(
                            &mut tx,
                            items,
                            std::mem::take(&mut round),
                            &mut outcomes,
                            &now,
                        )
                        .await?;
                    }
                    if let (Effect::Fail { state }, Some(row)) = (&effect, rows.get_mut(&key)) {
                        row.state = Some((*state).to_owned());
                    }
                    let try_number = command.task.as_ref().map_or(0, |t| t.try_number);
                    round.push(Update {
                        index,
                        key,
                        try_number,
                        effect,
                    });
                }
            }
        }
        self.run_round(&mut tx, items, round, &mut outcomes, &now)
            .await?;
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Dead("not decided".into())))
            .collect();
        let applied_indexes: Vec<usize> = (0..items.len())
            .filter(|i| matches!(outcomes.get(*i), Some(Outcome::Applied(_))))
            .collect();
        self.record_pods(&mut tx, items, &outcomes, &applied_indexes, &now)
            .await?;
        self.record_applied(&mut tx, items, &outcomes, &now).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn applied_ids(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
    ) -> Result<HashSet<String>, sqlx::Error> {
        let mut found = HashSet::new();
        for chunk in items.chunks(ROWS) {
            let mut m = Multi::new(self.backend);
            let list: Vec<String> = chunk.iter().map(|i| m.text(&i.command.id)).collect();
            let text = format!(
                "SELECT command_id FROM podstream_applied WHERE command_id IN ({})",
                list.join(", ")
            );
            for row in sqlx::query_with::<Any, _>(&text, m.args)
                .fetch_all(&mut *conn)
                .await?
            {
                found.insert(row.try_get::<String, _>(0)?);
            }
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
        let mut rows = HashMap::new();
        for chunk in keys.chunks(ROWS) {
            let mut m = Multi::new(self.backend);
            let tuples: Vec<String> = chunk
                .iter()
                .map(|(d, t, r, i)| {
                    format!(
                        "({}, {}, {}, {})",
                        m.text(d),
                        m.text(t),
                        m.text(r),
                        m.int(*i)
                    )
                })
                .collect();
            // A join with the keys as a table lets both databases use the primary key; a
            // row-value IN list makes PostgreSQL scan the table.
            let text = format!(
                "WITH v(dag_id, task_id, run_id, map_index) AS (VALUES {})
                 SELECT t.dag_id, t.task_id, t.run_id, CAST(t.map_index AS BIGINT), t.state,
                        CAST(t.try_number AS BIGINT), CAST(t.max_tries AS BIGINT)
                 FROM task_instance t JOIN v ON t.dag_id = v.dag_id AND t.task_id = v.task_id
                   AND t.run_id = v.run_id AND t.map_index = v.map_index",
                tuples.join(", ")
            );
            for row in sqlx::query_with::<Any, _>(&text, m.args)
                .fetch_all(&mut *conn)
                .await?
            {
                let key = (
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                );
                rows.insert(
                    key,
                    TiRow {
                        state: row.try_get::<Option<String>, _>(4)?,
                        try_number: row.try_get::<Option<i64>, _>(5)?.unwrap_or(0),
                        max_tries: row.try_get::<Option<i64>, _>(6)?.unwrap_or(-1),
                    },
                );
            }
        }
        Ok(rows)
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
        for chunk in round.chunks(ROWS) {
            let (fails, transfers): (Vec<&Update>, Vec<&Update>) = chunk
                .iter()
                .partition(|u| matches!(u.effect, Effect::Fail { .. }));
            let mut done: HashSet<Key> = HashSet::new();
            if !fails.is_empty() {
                let mut m = Multi::new(self.backend);
                let values: Vec<String> = fails
                    .iter()
                    .map(|u| {
                        let state = match u.effect {
                            Effect::Fail { state } => state,
                            _ => "failed",
                        };
                        let key = m.key(&u.key, u.try_number);
                        format!("({key}, {})", m.text(state))
                    })
                    .collect();
                let now_sql = m.now(now);
                let duration = match self.backend {
                    Backend::Postgres => {
                        "EXTRACT(EPOCH FROM (now() - task_instance.start_date))".to_owned()
                    }
                    Backend::Sqlite => format!(
                        "(julianday({now_sql}) - julianday(task_instance.start_date)) * 86400.0"
                    ),
                };
                let set = format!(
                    "state = v.new_state, end_date = {now_sql}, duration = {duration}, updated_at = {now_sql}"
                );
                done.extend(guarded_update(conn, m, "new_state", &values, &set).await?);
            }
            if !transfers.is_empty() {
                let mut m = Multi::new(self.backend);
                let values: Vec<String> = transfers
                    .iter()
                    .map(|u| {
                        let job = match u.effect {
                            Effect::Transfer { job_id } => job_id,
                            _ => 0,
                        };
                        let key = m.key(&u.key, u.try_number);
                        format!("({key}, {}, {})", m.int(job), m.text(&job.to_string()))
                    })
                    .collect();
                let now_sql = m.now(now);
                let set = format!(
                    "queued_by_job_id = v.job_id, external_executor_id = v.executor_id, updated_at = {now_sql}"
                );
                done.extend(guarded_update(conn, m, "job_id, executor_id", &values, &set).await?);
            }
            let mut logged = Vec::new();
            for update in chunk {
                if !done.contains(&update.key) {
                    outcomes[update.index] = Some(Outcome::Skipped(Skip::NotAdoptable(
                        "changed meanwhile".into(),
                    )));
                    continue;
                }
                let name = match update.effect {
                    Effect::Fail { state } => state,
                    Effect::Transfer { .. } => "transfer",
                    Effect::Record => "recorded",
                };
                outcomes[update.index] = Some(Outcome::Applied(name));
                logged.push((update.index, name));
            }
            self.insert_logs(conn, items, &logged, now).await?;
        }
        Ok(())
    }

    async fn insert_logs(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
        applied: &[(usize, &'static str)],
        now: &str,
    ) -> Result<(), sqlx::Error> {
        if applied.is_empty() {
            return Ok(());
        }
        let mut m = Multi::new(self.backend);
        let now_sql = m.now(now);
        let values: Vec<String> = applied
            .iter()
            .filter_map(|(i, name)| items.get(*i).map(|item| (item, *name)))
            .filter_map(|(item, name)| {
                let command = &item.command;
                let task = command.task.as_ref()?;
                let (event, extra) = log_entry(command, name)?;
                Some(format!(
                    "({now_sql}, {}, {}, {}, {}, {}, 'podstream', {}, {})",
                    m.text(&task.dag_id),
                    m.text(&task.task_id),
                    m.int(task.map_index),
                    m.text(event),
                    m.text(&task.run_id),
                    m.text(&extra.to_string()),
                    m.int(task.try_number)
                ))
            })
            .collect();
        if values.is_empty() {
            return Ok(());
        }
        let text = format!(
            "INSERT INTO log (dttm, dag_id, task_id, map_index, event, run_id, owner, extra, try_number) VALUES {}",
            values.join(", ")
        );
        sqlx::query_with::<Any, _>(&text, m.args)
            .execute(&mut *conn)
            .await?;
        Ok(())
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
        for chunk in chosen.chunks(ROWS) {
            let mut m = Multi::new(self.backend);
            let now_sql = m.now(now);
            let values: Vec<String> = chunk
                .iter()
                .filter_map(|i| items.get(*i))
                .filter_map(|item| {
                    let c = &item.command;
                    let (task, pod) = (c.task.as_ref()?, c.pod.as_ref()?);
                    let kind = c.kind.as_ref().map_or("unknown", Kind::name);
                    Some(format!(
                        "({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {now_sql})",
                        m.text(&task.dag_id),
                        m.text(&task.task_id),
                        m.text(&task.run_id),
                        m.int(task.map_index),
                        m.int(task.try_number),
                        m.text(&pod.namespace),
                        m.text(&pod.name),
                        m.text(&pod.uid),
                        m.text(&c.owner),
                        m.text(kind),
                        m.text(&c.resource_version)
                    ))
                })
                .collect();
            if values.is_empty() {
                continue;
            }
            let text = format!(
                "INSERT INTO podstream_ti_pod (dag_id, task_id, run_id, map_index, try_number, pod_namespace, pod_name, pod_uid, owner, last_command, resource_version, updated_at)
                 VALUES {} ON CONFLICT (dag_id, task_id, run_id, map_index) DO UPDATE SET
                   try_number = excluded.try_number, pod_namespace = excluded.pod_namespace, pod_name = excluded.pod_name,
                   pod_uid = excluded.pod_uid, owner = excluded.owner, last_command = excluded.last_command,
                   resource_version = excluded.resource_version, updated_at = excluded.updated_at",
                values.join(", ")
            );
            sqlx::query_with::<Any, _>(&text, m.args)
                .execute(&mut *conn)
                .await?;
        }
        let duplicates: Vec<(&Command, &podstream_proto::PodRef)> = indexes
            .iter()
            .filter(|i| matches!(outcomes.get(**i), Some(Outcome::Applied(_))))
            .filter_map(|i| items.get(*i))
            .filter_map(|item| match &item.command.kind {
                Some(Kind::Duplicate(d)) => {
                    Some(d.others.iter().map(move |other| (&item.command, other)))
                }
                _ => None,
            })
            .flatten()
            .collect();
        for chunk in duplicates.chunks(ROWS) {
            let mut m = Multi::new(self.backend);
            let now_sql = m.now(now);
            let values: Vec<String> = chunk
                .iter()
                .filter_map(|(c, other)| {
                    let task = c.task.as_ref()?;
                    let chosen = match &c.kind {
                        Some(Kind::Duplicate(d)) => {
                            d.chosen.as_ref().map_or(String::new(), |p| p.uid.clone())
                        }
                        _ => String::new(),
                    };
                    Some(format!(
                        "({}, {}, {}, {}, {}, {}, {}, {}, {now_sql})",
                        m.text(&task.dag_id),
                        m.text(&task.task_id),
                        m.text(&task.run_id),
                        m.int(task.map_index),
                        m.int(task.try_number),
                        m.text(&chosen),
                        m.text(&other.uid),
                        m.text(&other.name)
                    ))
                })
                .collect();
            if values.is_empty() {
                continue;
            }
            let text = format!(
                "INSERT INTO podstream_duplicate (dag_id, task_id, run_id, map_index, try_number, chosen_uid, other_uid, other_name, recorded_at)
                 VALUES {} ON CONFLICT DO NOTHING",
                values.join(", ")
            );
            sqlx::query_with::<Any, _>(&text, m.args)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Every decided command id, with what became of it, in the batch's transaction.
    async fn record_applied(
        &self,
        conn: &mut AnyConnection,
        items: &[Item],
        outcomes: &[Outcome],
        now: &str,
    ) -> Result<(), sqlx::Error> {
        let recorded: Vec<(&Item, &'static str)> = items
            .iter()
            .zip(outcomes)
            .filter_map(|(item, outcome)| match outcome {
                Outcome::Applied(name) => Some((item, *name)),
                Outcome::Skipped(Skip::AlreadyApplied) | Outcome::Dead(_) => None,
                Outcome::Skipped(skip) => Some((item, skip.name())),
            })
            .collect();
        for chunk in recorded.chunks(ROWS) {
            let mut m = Multi::new(self.backend);
            let now_sql = m.now(now);
            let values: Vec<String> = chunk
                .iter()
                .map(|(item, name)| {
                    let sequence = item.sequence.and_then(|s| i64::try_from(s).ok());
                    format!(
                        "({}, {}, {}, {now_sql})",
                        m.text(&item.command.id),
                        m.opt_int(sequence),
                        m.text(name)
                    )
                })
                .collect();
            let text = format!(
                "INSERT INTO podstream_applied (command_id, stream_sequence, outcome, applied_at) VALUES {}",
                values.join(", ")
            );
            sqlx::query_with::<Any, _>(&text, m.args)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}

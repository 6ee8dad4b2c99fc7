//! The statement texts of a batch, one fixed text each per backend and Airflow schema.

use crate::airflow::AirflowSchema;
use crate::dialect::Backend;

/// The set-based statements, one fixed text each: the batch's rows travel as one JSON array
/// parameter (`json_to_recordset` on PostgreSQL, `json_each` on SQLite), so every batch
/// reuses the statement the connection prepared for the first one, and binding costs one
/// parameter whatever the batch size. On SQLite the batch's timestamp is a second parameter.
#[derive(Debug, Clone)]
pub struct SetStatements {
    pub(crate) applied_ids: String,
    pub(crate) ti_rows: String,
    pub(crate) last_transfers: String,
    pub(crate) fail: String,
    pub(crate) transfer: String,
    pub(crate) log: String,
    pub(crate) ti_pod: String,
    pub(crate) ti_owner: String,
    pub(crate) duplicate: String,
    pub(crate) applied: String,
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
        let live = crate::guard::live_pod_commands_sql();
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
        // A pod acts only on its own TI, checked again where the row is written (the guard
        // checks it first): on Airflow 3 a pod that names a UUID moves only the TI with that
        // id (PostgreSQL stores a native uuid; SQLAlchemy writes 32 hex digits into SQLite),
        // on Airflow 2 only a pod that names none moves anything.
        let same_instance = match (airflow, backend) {
            (AirflowSchema::V2, _) => "AND v.ti_id IS NULL",
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
            // PostgreSQL locks the rows, in key order (no deadlock between sinks): another
            // sink's batch on the same TIs waits, and its next statements read what this one
            // committed (the applied ids, the last transfers). SQLite has a single writer.
            ti_rows: format!(
                "SELECT t.dag_id, t.task_id, t.run_id, CAST(t.map_index AS BIGINT), t.state,
                        CAST(t.try_number AS BIGINT), CAST(t.max_tries AS BIGINT), {ti_id},
                        t.hostname, p.pod_namespace, p.pod_name, p.last_command
                 FROM {} JOIN task_instance t ON t.dag_id = v.dag_id AND t.task_id = v.task_id
                   AND t.run_id = v.run_id AND t.map_index = v.map_index
                 LEFT JOIN podstream_ti_pod p ON p.dag_id = t.dag_id AND p.task_id = t.task_id
                   AND p.run_id = t.run_id AND p.map_index = t.map_index
                   AND p.try_number = t.try_number{}",
                rows(&KEY),
                match backend {
                    Backend::Postgres => {
                        "\n                 ORDER BY t.dag_id, t.task_id, t.run_id, t.map_index FOR UPDATE OF t"
                    }
                    Backend::Sqlite => "",
                }
            ),
            // Read after `ti_rows`, as its own statement: a join there would read it from
            // the snapshot taken before the lock was granted.
            last_transfers: format!(
                "SELECT o.dag_id, o.task_id, o.run_id, CAST(o.map_index AS BIGINT), o.stream_sequence
                 FROM {} JOIN podstream_ti_owner o ON o.dag_id = v.dag_id AND o.task_id = v.task_id
                   AND o.run_id = v.run_id AND o.map_index = v.map_index",
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
            // `WHERE true`: SQLite's parser needs it between a SELECT and ON CONFLICT. The
            // row binds the try to its first pod that ran: another pod of the same try (a
            // copy) replaces it only once that pod has ended.
            ti_pod: format!(
                "INSERT INTO podstream_ti_pod (dag_id, task_id, run_id, map_index, try_number, pod_namespace, pod_name, pod_uid, owner, last_command, resource_version, updated_at)
                 SELECT v.dag_id, v.task_id, v.run_id, v.map_index, v.try_number, v.pod_namespace, v.pod_name, v.pod_uid, v.owner, v.last_command, v.resource_version, {now}
                 FROM {} WHERE true
                 ON CONFLICT (dag_id, task_id, run_id, map_index) DO UPDATE SET
                   try_number = excluded.try_number, pod_namespace = excluded.pod_namespace, pod_name = excluded.pod_name,
                   pod_uid = excluded.pod_uid, owner = excluded.owner, last_command = excluded.last_command,
                   resource_version = excluded.resource_version, updated_at = excluded.updated_at
                 WHERE podstream_ti_pod.try_number <> excluded.try_number
                   OR podstream_ti_pod.last_command NOT IN {live}
                   OR (podstream_ti_pod.pod_namespace = excluded.pod_namespace
                       AND podstream_ti_pod.pod_name = excluded.pod_name)",
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
            // Only forward: a row is never moved back to an older transfer.
            ti_owner: format!(
                "INSERT INTO podstream_ti_owner (dag_id, task_id, run_id, map_index, owner, stream_sequence, updated_at)
                 SELECT v.dag_id, v.task_id, v.run_id, v.map_index, v.owner, v.sequence, {now}
                 FROM {} WHERE true
                 ON CONFLICT (dag_id, task_id, run_id, map_index) DO UPDATE SET
                   owner = excluded.owner, stream_sequence = excluded.stream_sequence, updated_at = excluded.updated_at
                 WHERE excluded.stream_sequence > podstream_ti_owner.stream_sequence",
                rows(&key_and(&[("owner", "text"), ("sequence", "bigint")]))
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
    pub fn named(&self) -> [(&'static str, &str); 10] {
        [
            ("applied_ids", &self.applied_ids),
            ("ti_rows", &self.ti_rows),
            ("last_transfers", &self.last_transfers),
            ("fail", &self.fail),
            ("transfer", &self.transfer),
            ("log", &self.log),
            ("ti_pod", &self.ti_pod),
            ("ti_owner", &self.ti_owner),
            ("duplicate", &self.duplicate),
            ("applied", &self.applied),
        ]
    }
}

//! `podstream apply` as docs/contract.md §4 describes it: decide's JSON lines into a metadata DB,
//! a one-line summary, and a second run that changes nothing.

use std::io::Write;
use std::process::{Command, Stdio};

use podstream_proto::line::CommandLine;
use podstream_proto::v1::command::Kind;
use podstream_proto::v1::{Fail, Transfer};
use podstream_proto::{PodRef, TaskKey};
use podstream_tests::airflow::{Airflow, AirflowDb, SeedTi};
use podstream_tests::podstream_binary;

fn line(id: &str, task_id: &str, kind: Kind) -> String {
    let command = podstream_proto::Command {
        id: id.into(),
        task: Some(TaskKey {
            dag_id: "etl".into(),
            task_id: task_id.into(),
            run_id: "r1".into(),
            map_index: -1,
            try_number: 1,
            ..TaskKey::default()
        }),
        pod: Some(PodRef {
            namespace: "airflow".into(),
            name: format!("{task_id}-pod"),
            uid: format!("{task_id}-uid"),
        }),
        owner: "1".into(),
        resource_version: "9".into(),
        kind: Some(kind),
    };
    serde_json::to_string(&CommandLine::from(&command)).unwrap()
}

fn apply(db_url: &str, input: &str) -> (String, String) {
    let mut child = Command::new(podstream_binary())
        .args(["apply", "--db", db_url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A running TI `extract` and a queued TI `load`, both on try 1 of job 1.
const SEED: [SeedTi<'static>; 2] = [
    SeedTi {
        task_id: "extract",
        map_index: -1,
        state: Some("running"),
        try_number: 1,
        max_tries: 1,
    },
    SeedTi {
        task_id: "load",
        map_index: -1,
        state: Some("queued"),
        try_number: 1,
        max_tries: 1,
    },
];

fn pod_failed() -> Kind {
    Kind::Fail(Fail {
        reason: "pod_failed".into(),
        ..Fail::default()
    })
}

/// `extract`'s pod failed (command `a`) and `load`'s moved from job 1 to 2 (command `b`).
fn fail_and_transfer() -> [String; 2] {
    [
        line("a", "extract", pod_failed()),
        line(
            "b",
            "load",
            Kind::Transfer(Transfer {
                from: "1".into(),
                to: "2".into(),
            }),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_twice_is_apply_once() {
    let db = AirflowDb::sqlite(Airflow::line("3.1"));
    let database = podstream_sink::Database::connect(&db.url).await.unwrap();
    for statement in db.seed_sql("etl", "r1", &SEED) {
        sqlx::query(&statement)
            .execute(&database.pool)
            .await
            .unwrap();
    }
    database.pool.close().await;
    let [fail_extract, transfer_load] = fail_and_transfer();
    let input = [
        fail_extract,
        transfer_load,
        line("c", "missing", pod_failed()),
        r#"{"kind":"invalid","error":"not JSON"}"#.to_owned(),
        "{ broken".to_owned(),
    ]
    .join("\n");

    let (first, errors) = apply(&db.url, &input);
    assert_eq!(
        first, "applied 2, skipped 1 (unknown_ti 1), dead-lettered 2",
        "{errors}"
    );
    assert!(
        errors.contains("line 4") && errors.contains("line 5"),
        "{errors}"
    );
    let (second, _) = apply(&db.url, &input);
    assert_eq!(
        second,
        "applied 0, skipped 3 (already_applied 3), dead-lettered 2"
    );
    assert_eq!(
        db.states_through_airflow("etl"),
        [
            ("extract".to_owned(), -1, "up_for_retry".to_owned()),
            ("load".to_owned(), -1, "queued".to_owned())
        ]
    );
}

/// The SQL block of docs/install.md that sets up the sink's role: the page and this test are
/// one source for the grants.
fn documented_grants() -> String {
    let page =
        std::fs::read_to_string(podstream_tests::workspace_root().join("docs/install.md")).unwrap();
    let block = page
        .split("```sql\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/install.md has an sql block with the sink's grants");
    block.to_owned()
}

/// The sink works under a role with only the grants docs/install.md gives it: it creates its
/// own tables in `public` (PostgreSQL 15 no longer lets every role do so), fails and
/// transfers task instances and writes their audit rows into `log`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_works_under_a_role_with_only_the_documented_grants() {
    let cluster = podstream_tests::postgres::PgCluster::start();
    let db = AirflowDb::postgres(Airflow::line("3.1"), &cluster, "airflow");
    for statement in db.seed_sql("etl", "r1", &SEED) {
        cluster.query("airflow", &statement);
    }
    cluster.query("airflow", &documented_grants());
    let as_podstream = db
        .url
        .replacen("postgres://postgres@", "postgres://podstream@", 1);
    let input = fail_and_transfer().join("\n");
    let (summary, errors) = apply(&as_podstream, &input);
    assert_eq!(summary, "applied 2, skipped 0, dead-lettered 0", "{errors}");
    assert_eq!(
        cluster.query(
            "airflow",
            "SELECT task_id, state, queued_by_job_id FROM task_instance ORDER BY task_id"
        ),
        [
            ["extract", "up_for_retry", "1"].map(str::to_owned).to_vec(),
            ["load", "queued", "2"].map(str::to_owned).to_vec(),
        ]
    );
    let audit = cluster.query(
        "airflow",
        "SELECT count(*) FROM log WHERE owner = 'podstream'",
    );
    assert_ne!(audit, [["0".to_owned()]], "no audit row in log");
    let owner = cluster.query(
        "airflow",
        "SELECT tableowner FROM pg_tables WHERE tablename = 'podstream_applied'",
    );
    assert_eq!(owner, [["podstream".to_owned()]]);
}

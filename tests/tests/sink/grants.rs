//! The sink's PostgreSQL role exactly as docs/install.md grants it: taken from the page, so a
//! grant the sink needs and the page lacks fails here, and so does a write the page forbids.

use sqlx::Connection as _;

use super::support::*;

/// The role the page's SQL creates, renamed so tests sharing the cluster keep apart.
const ROLE: &str = "podstream_documented";

/// The SQL block of install.md's PostgreSQL step, for `database` and [`ROLE`]: one statement
/// per item, comments dropped.
fn documented_grants(database: &str) -> Vec<String> {
    podstream_tests::install_page_sql()
        .into_iter()
        .filter(|s| s.contains(" podstream"))
        .map(|s| {
            s.replace("ROLE podstream ", &format!("ROLE {ROLE} "))
                .replace(" TO podstream", &format!(" TO {ROLE}"))
                .replace("DATABASE airflow ", &format!("DATABASE \"{database}\" "))
        })
        .collect()
}

/// With exactly the page's grants the sink applies every command as with a superuser, and
/// its role can change no column of `task_instance` but those it writes: never
/// `executor_config`, a pickle Airflow unpickles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_grants_are_enough_and_no_more() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    ensure_streams(&js).await;
    let (target, db) = prepared(Airflow::line("3.1"), true, "documented_grants").await;
    let database = target
        .url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let grants = documented_grants(&database);
    assert!(grants.len() >= 6, "{grants:#?}");
    let mut admin = sqlx::PgConnection::connect(&target.url).await.unwrap();
    // As on a fresh install: the sink's role makes its own tables (the admin's connection
    // above made them).
    sqlx::query(
        "DROP TABLE podstream_applied, podstream_ti_pod, podstream_ti_owner, podstream_duplicate",
    )
    .execute(&mut admin)
    .await
    .unwrap();
    for grant in &grants {
        sqlx::query(grant)
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("{grant}: {e}"));
    }
    let as_role = target.url.replacen("postgres@", &format!("{ROLE}@"), 1);
    let (task, stop) = start_sink(&nats.url(), Database::connect(&as_role).await.unwrap());
    publish(&js, &commands()).await;
    wait_for(
        &db,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM podstream_applied",
        commands().len() as i64,
    )
    .await;
    let _ = stop.send(());
    let summary = task.await.unwrap();
    assert_eq!(summary.dead_lettered, 0, "{summary}");
    assert_eq!(states(&db).await, expected_states());

    let mut role = sqlx::PgConnection::connect(&as_role).await.unwrap();
    let refused = sqlx::query("UPDATE task_instance SET executor_config = NULL")
        .execute(&mut role)
        .await
        .expect_err("the sink's role may not write executor_config");
    assert!(
        refused.to_string().contains("permission denied"),
        "{refused}"
    );
    sqlx::query("UPDATE task_instance SET updated_at = updated_at WHERE false")
        .execute(&mut role)
        .await
        .expect("a column the sink writes");

    // `podstream check sink` as that role: every privilege a passing line; one revoked, its
    // line fails with the GRANT to run, and the exit status says configuration.
    let check = |nats: &str| {
        let output = std::process::Command::new(podstream_tests::podstream_binary())
            .args(["check", "sink", "--nats", nats, "--db", &as_role])
            .env_remove("PODSTREAM_STREAM_REPLICAS")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (code, report) = check(&nats.url());
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains("ok    database: UPDATE (queued_by_job_id) on task_instance"),
        "{report}"
    );
    assert!(report.lines().all(|l| l.starts_with("ok ")), "{report}");
    sqlx::query(&format!(
        "REVOKE UPDATE (queued_by_job_id) ON task_instance FROM {ROLE}"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    let (code, report) = check(&nats.url());
    assert_eq!(code, Some(78), "{report}");
    let failed: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 1, "{report}");
    assert!(
        failed[0].contains("GRANT UPDATE (queued_by_job_id) ON task_instance TO"),
        "{report}"
    );
}

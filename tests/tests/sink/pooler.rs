//! Behind PgBouncer (Debian's): in session pooling the sink applies every rule as on
//! PostgreSQL itself; transaction pooling, which would hand its prepared statements and
//! session settings to other clients, is refused at start with a message that says so,
//! whether PgBouncer refuses sqlx's `extra_float_digits` or is told to ignore it.

use podstream_sink::db::DbError;
use podstream_tests::postgres::{PgBouncer, PoolMode};

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_session_pooling_applies_and_transaction_pooling_is_refused() {
    let name = "pooled";
    // Seeded directly, then applied through session pooling.
    let (_target, _direct) = prepared(Airflow::line("3.1"), true, name).await;
    let session = PgBouncer::start(cluster(), name, PoolMode::Session, true);
    let db = Database::connect(&session.url(name)).await.unwrap();
    let outcomes = db.apply_batch(&items(commands())).await.unwrap();
    assert_eq!(outcomes, expected_outcomes(), "through session pooling");
    assert_eq!(
        states(&db).await,
        expected_states(),
        "through session pooling"
    );

    for ignore_extra_float_digits in [false, true] {
        let pooled = PgBouncer::start(
            cluster(),
            name,
            PoolMode::Transaction,
            ignore_extra_float_digits,
        );
        let started = std::time::Instant::now();
        let error = Database::connect(&pooled.url(name)).await.unwrap_err();
        assert!(
            matches!(error, DbError::Pooler(..)),
            "ignoring extra_float_digits: {ignore_extra_float_digits}: {error:#}"
        );
        let message = format!("{error:#}");
        assert!(
            message.contains("not through PgBouncer") && message.contains("docs/install.md"),
            "{message}"
        );
        // At once, not after retrying as if the server were away.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{message}"
        );
    }
}

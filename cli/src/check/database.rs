//! The sink's database: it answers, it is an Airflow metadata database podstream knows, and
//! the role holds each privilege the sink uses (PostgreSQL; SQLite has no roles).

use std::time::Duration;

use podstream_bus::fault::{Classified, Fault};
use podstream_sink::Database;
use podstream_sink::db::DbTarget;
use podstream_sink::dialect::Backend;
use podstream_sink::grants;

use super::Report;

/// How long the database may take to answer before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// One line for the connection and schema, then one per privilege.
pub(super) async fn check(report: &mut Report, target: &DbTarget) {
    let shown = target.redacted();
    let db = match tokio::time::timeout(CONNECT_TIMEOUT, Database::connect_to(target)).await {
        Ok(Ok(db)) => db,
        Ok(Err(error)) => {
            report.fail(
                "database",
                error.fault(),
                format!("{:#}", anyhow::Error::new(error)),
            );
            return;
        }
        Err(_) => {
            report.fail(
                "database",
                Fault::Unavailable,
                format!(
                    "{shown} did not answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            );
            return;
        }
    };
    report.pass(
        "database",
        format!(
            "{shown}: Airflow {}",
            db.release.map_or("schema of a known family", |r| r.release)
        ),
    );
    if db.backend != Backend::Postgres {
        return;
    }
    match grants::held(&db.pool).await {
        Ok(answers) => {
            for (privilege, holds) in answers {
                let item = format!("database: {privilege}");
                if holds {
                    report.pass(item, format!("granted ({})", privilege.why));
                } else {
                    report.fail(
                        item,
                        Fault::Configuration,
                        format!(
                            "not granted, needed for {}: {} (docs/install.md, step 2)",
                            privilege.why,
                            privilege.grant("<the sink's role>")
                        ),
                    );
                }
            }
        }
        Err(error) => report.fail(
            "database privileges",
            error.fault(),
            format!("{:#}", anyhow::Error::new(error)),
        ),
    }
}

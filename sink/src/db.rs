//! The metadata database: connecting (PostgreSQL or SQLite), telling which Airflow made it
//! (`crate::airflow`), and podstream's own tables.

use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions, install_default_drivers};
use sqlx::{AnyPool, ConnectOptions as _, Row};

use crate::airflow::{self, AirflowRelease, AirflowSchema};
use crate::dialect::Backend;

/// Why the database cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The URL is not `postgres://...` or `sqlite://...` (or SQLAlchemy's `+driver` forms).
    #[error(
        "unsupported database URL scheme in {0} (use postgres://user@host:port/db or sqlite:///abs/path.db; SQLAlchemy's postgresql+psycopg2:// and the like are read as postgresql://)"
    )]
    Scheme(String),
    /// The URL does not parse.
    #[error("invalid database URL {0}: {1}")]
    Url(String, String),
    /// `alembic_version` holds a revision no supported release has, and the tables lack a
    /// column the sink needs.
    #[error(
        "unknown Airflow schema: alembic_version is {0:?}, not a supported release's ({known}), and its task_instance or log table lacks a column the sink writes",
        known = crate::airflow::known_revisions()
    )]
    UnknownSchema(String),
    /// The database has no `alembic_version`: not an Airflow metadata database.
    #[error("not an Airflow metadata database: no alembic_version ({0})")]
    NotAirflow(String),
    /// A connection pooler (PgBouncer) answered, not PostgreSQL: the sink's session settings
    /// and prepared statements need a server connection of its own.
    #[error(
        "{0} answered as PgBouncer does ({1}): connect the sink to PostgreSQL itself, not through PgBouncer; its transaction pooling would hand the sink's prepared statements and session settings to other clients (docs/install.md, PgBouncer)"
    )]
    Pooler(String, String),
    /// The server's TLS certificate did not verify (or TLS was refused): it stays so, so
    /// there is no retry.
    #[error("TLS to {db} failed")]
    Tls {
        /// The database, its password hidden.
        db: String,
        /// What the driver said.
        #[source]
        source: sqlx::Error,
    },
    /// The server refused the connection for good (credentials, a database that does not
    /// exist); an unreachable one is waited for instead.
    #[error("connecting to {db}")]
    Connect {
        /// The database, its password hidden.
        db: String,
        /// What the driver said.
        #[source]
        source: sqlx::Error,
    },
    /// A statement of the start failed.
    #[error("{what}")]
    Query {
        /// What the statement was for.
        what: String,
        /// What the driver said.
        #[source]
        source: sqlx::Error,
    },
}

impl podstream_bus::fault::Classified for DbError {
    fn fault(&self) -> podstream_bus::fault::Fault {
        use podstream_bus::fault::Fault;
        match self {
            DbError::Scheme(_) | DbError::Url(..) | DbError::Pooler(..) | DbError::Tls { .. } => {
                Fault::Configuration
            }
            DbError::NotAirflow(_) | DbError::UnknownSchema(_) => Fault::Data,
            DbError::Connect { .. } | DbError::Query { .. } => Fault::Unavailable,
        }
    }
}

/// `error` as [`DbError::Query`] for `what`.
pub(crate) fn query_failed(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> DbError {
    move |source| DbError::Query {
        what: what.into(),
        source,
    }
}

/// Connections in a PostgreSQL pool (SQLite: one, its single writer).
pub(crate) const POOL_SIZE: u32 = 8;

/// A connected metadata database.
#[derive(Debug, Clone)]
pub struct Database {
    /// The pool.
    pub pool: AnyPool,
    /// Its dialect.
    pub backend: Backend,
    /// Its Airflow schema family.
    pub airflow: AirflowSchema,
    /// The supported release that made it, when its alembic revision names one.
    pub release: Option<&'static AirflowRelease>,
    /// The statements, in its dialect and for its schema.
    pub sql: std::sync::Arc<crate::statements::SetStatements>,
    /// What the guard applies beside the TI row.
    pub policy: std::sync::Arc<crate::guard::Policy>,
}

/// A table's column names.
async fn table_columns(
    pool: &AnyPool,
    backend: Backend,
    table: &'static str,
) -> Result<Vec<String>, DbError> {
    let query = match backend {
        Backend::Postgres => format!(
            "SELECT CAST(column_name AS TEXT) FROM information_schema.columns WHERE table_name = '{table}' AND table_schema = current_schema()"
        ),
        Backend::Sqlite => format!("SELECT name FROM pragma_table_info('{table}')"),
    };
    let rows = sqlx::query(&query)
        .fetch_all(pool)
        .await
        .map_err(query_failed(format!("reading the columns of {table}")))?;
    rows.iter()
        .map(|row| {
            row.try_get::<String, _>(0)
                .map_err(query_failed("reading a column name"))
        })
        .collect()
}

/// The URL with any password replaced, for logs and errors; never fails.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if Backend::of_scheme(parsed.scheme()).is_some() => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        // Not a database URL: it may still hold a password before an `@`; show only the
        // user name.
        _ => match url.split_once('@') {
            Some((before, _)) => format!("{}@...", before.split(':').next().unwrap_or_default()),
            None => url.to_owned(),
        },
    }
}

/// A metadata database to connect to: its URL, and a password given apart from it (from
/// `--db-password-file` or `PODSTREAM_DB_PASSWORD`, kept out of the process list).
#[derive(Clone, Default)]
pub struct DbTarget {
    /// `postgres://user@host:port/db` or `sqlite:///abs/path.db`.
    pub url: String,
    /// Used when the URL carries none.
    pub password: Option<String>,
}

impl std::fmt::Debug for DbTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbTarget")
            .field("url", &redacted(&self.url))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl DbTarget {
    /// The database at `url`, with whatever credentials it carries.
    pub fn at(url: &str) -> DbTarget {
        DbTarget {
            url: url.to_owned(),
            password: None,
        }
    }

    /// The URL for logs and errors, without a password.
    pub fn redacted(&self) -> String {
        redacted(&self.url)
    }

    /// Whether the URL can name a database at all (scheme, syntax, port): checked before
    /// anything else starts, so a URL no retry can mend ends the command at once.
    pub fn check(&self) -> Result<(), DbError> {
        install_default_drivers();
        self.connect_options().map(|_| ())
    }

    /// Its dialect and the driver's connect options: the URL parsed, the password set
    /// through the parser (percent-encoded as needed) when the URL has none, and SQLite
    /// opened read-write without creating a file.
    pub fn connect_options(&self) -> Result<(Backend, AnyConnectOptions), DbError> {
        let mut url =
            url::Url::parse(&self.url).map_err(|e| DbError::Url(self.redacted(), e.to_string()))?;
        let backend =
            Backend::of_scheme(url.scheme()).ok_or_else(|| DbError::Scheme(self.redacted()))?;
        if url.scheme().contains('+') {
            // SQLAlchemy's `dialect+driver` (Airflow's sql_alchemy_conn as it is): the driver
            // is Python's business; the dialect is the scheme sqlx knows.
            let scheme = match backend {
                Backend::Postgres => "postgresql",
                Backend::Sqlite => "sqlite",
            };
            url.set_scheme(scheme).map_err(|()| {
                DbError::Url(self.redacted(), format!("cannot read it as {scheme}"))
            })?;
        }
        if let Some(password) = self.password.as_deref().filter(|p| !p.is_empty())
            && url.password().is_none()
        {
            url.set_password(Some(password))
                .map_err(|()| DbError::Url(self.redacted(), "it cannot carry a password".into()))?;
        }
        if backend == Backend::Sqlite && url.query().is_none() {
            url.set_query(Some("mode=rw"));
        }
        let options = AnyConnectOptions::from_url(&url)
            .map_err(|e| DbError::Url(self.redacted(), e.to_string()))?;
        Ok((backend, options))
    }
}

impl Database {
    /// Connects (retrying with backoff while the server is unreachable), checks the Airflow
    /// schema, and creates podstream's tables if missing.
    pub async fn connect(url: &str) -> Result<Database, DbError> {
        Database::connect_to(&DbTarget::at(url)).await
    }

    /// [`Database::connect`] to a target whose password may be given apart from its URL.
    pub async fn connect_to(target: &DbTarget) -> Result<Database, DbError> {
        install_default_drivers();
        let (backend, connect_options) = target.connect_options()?;
        let shown = target.redacted();
        if backend == Backend::Postgres {
            refuse_transaction_pooling(&connect_options, &shown).await?;
        }
        let mut backoff =
            podstream_bus::Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
        let pool = loop {
            let options = AnyPoolOptions::new()
                .max_connections(if backend == Backend::Sqlite {
                    1
                } else {
                    POOL_SIZE
                })
                .acquire_timeout(Duration::from_secs(10))
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        // The batch statements are prepared once per connection. PostgreSQL
                        // would soon give them a generic plan made with the statistics of
                        // that moment and keep it while the tables grow (one made while
                        // `podstream_applied` was empty scanned it on every batch: 13 ms a
                        // batch at 160k rows). Custom plans are made per batch, with the
                        // tables' sizes of the moment, for a fraction of a millisecond.
                        if backend == Backend::Postgres {
                            sqlx::query("SET plan_cache_mode = force_custom_plan")
                                .execute(conn)
                                .await?;
                        }
                        Ok(())
                    })
                });
            match options.connect_with(connect_options.clone()).await {
                Ok(pool) => break pool,
                // A certificate that does not verify stays so: no retry at start.
                Err(error) if tls_refused(&error) => {
                    return Err(DbError::Tls {
                        db: shown.to_string(),
                        source: error,
                    });
                }
                Err(error) if answered_by_pgbouncer(&error) => {
                    return Err(DbError::Pooler(shown.to_string(), error.to_string()));
                }
                Err(error) if is_transient(&error) => {
                    tracing::warn!(db = %shown, %error, retry_in_ms = backoff.delay().as_millis() as u64, "database unreachable; retrying");
                    backoff.wait().await;
                }
                Err(error) => {
                    return Err(DbError::Connect {
                        db: shown.to_string(),
                        source: error,
                    });
                }
            }
        };
        let revision: String = match sqlx::query("SELECT version_num FROM alembic_version")
            .fetch_one(&pool)
            .await
        {
            Ok(row) => row
                .try_get(0)
                .map_err(query_failed("reading alembic_version"))?,
            Err(error) => return Err(DbError::NotAirflow(error.to_string())),
        };
        let release = airflow::release_for(&revision);
        let airflow = match release {
            Some(release) => release.schema(),
            None => {
                let columns = |table: &'static str| table_columns(&pool, backend, table);
                let (task_instance, log) = (columns("task_instance").await?, columns("log").await?);
                let schema = airflow::schema_from_columns(&task_instance, &log)
                    .ok_or_else(|| DbError::UnknownSchema(revision.clone()))?;
                tracing::warn!(
                    revision,
                    ?schema,
                    known = %airflow::known_revisions(),
                    "alembic revision of no supported Airflow release; its tables have every column the sink writes, so going on"
                );
                schema
            }
        };
        let database = Database {
            pool,
            backend,
            airflow,
            release,
            sql: std::sync::Arc::new(crate::statements::SetStatements::new(backend, airflow)),
            policy: std::sync::Arc::default(),
        };
        database.create_tables().await?;
        tracing::info!(db = %shown, ?backend, ?airflow, release = release.map(|r| r.release), "metadata database ready");
        Ok(database)
    }

    /// This database with the guard applying `policy`.
    pub fn with_policy(self, policy: crate::guard::Policy) -> Database {
        Database {
            policy: std::sync::Arc::new(policy),
            ..self
        }
    }

    async fn create_tables(&self) -> Result<(), DbError> {
        let timestamp = match self.backend {
            Backend::Postgres => "TIMESTAMP WITH TIME ZONE",
            Backend::Sqlite => "TIMESTAMP",
        };
        let statements = [
            format!(
                "CREATE TABLE IF NOT EXISTS podstream_applied (
                    command_id VARCHAR(512) NOT NULL PRIMARY KEY,
                    stream_sequence BIGINT,
                    outcome VARCHAR(64) NOT NULL,
                    applied_at {timestamp} NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS podstream_ti_pod (
                    dag_id VARCHAR(250) NOT NULL,
                    task_id VARCHAR(250) NOT NULL,
                    run_id VARCHAR(250) NOT NULL,
                    map_index INTEGER NOT NULL,
                    try_number INTEGER NOT NULL,
                    pod_namespace VARCHAR(253) NOT NULL,
                    pod_name VARCHAR(253) NOT NULL,
                    pod_uid VARCHAR(64) NOT NULL,
                    owner VARCHAR(250) NOT NULL,
                    last_command VARCHAR(32) NOT NULL,
                    resource_version VARCHAR(64) NOT NULL,
                    updated_at {timestamp} NOT NULL,
                    PRIMARY KEY (dag_id, task_id, run_id, map_index))"
            ),
            // The commands-stream sequence of the last transfer applied to each TI: an older
            // transfer delivered late (a redelivery after a crash, another sink) is skipped.
            format!(
                "CREATE TABLE IF NOT EXISTS podstream_ti_owner (
                    dag_id VARCHAR(250) NOT NULL,
                    task_id VARCHAR(250) NOT NULL,
                    run_id VARCHAR(250) NOT NULL,
                    map_index INTEGER NOT NULL,
                    owner VARCHAR(250) NOT NULL,
                    stream_sequence BIGINT NOT NULL,
                    updated_at {timestamp} NOT NULL,
                    PRIMARY KEY (dag_id, task_id, run_id, map_index))"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS podstream_duplicate (
                    dag_id VARCHAR(250) NOT NULL,
                    task_id VARCHAR(250) NOT NULL,
                    run_id VARCHAR(250) NOT NULL,
                    map_index INTEGER NOT NULL,
                    try_number INTEGER NOT NULL,
                    chosen_uid VARCHAR(64) NOT NULL,
                    other_uid VARCHAR(64) NOT NULL,
                    other_name VARCHAR(253) NOT NULL,
                    recorded_at {timestamp} NOT NULL,
                    PRIMARY KEY (dag_id, task_id, run_id, map_index, try_number, other_uid))"
            ),
        ];
        for statement in statements {
            sqlx::query(&statement)
                .execute(&self.pool)
                .await
                .map_err(query_failed("creating podstream tables"))?;
        }
        Ok(())
    }
}

/// Whether connecting may succeed by trying again (the server is not up yet, a network
/// hiccup, a locked SQLite file), as opposed to a refusal (wrong password, no such
/// database) that waiting does not mend.
pub fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.to_string()).unwrap_or_default();
            // PostgreSQL: 08 connection, 53 resources, 57 operator intervention (shutdown),
            // 40 serialization/deadlock. SQLite: BUSY, LOCKED.
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57")
                || code.starts_with("40")
                || matches!(sqlite_primary_code(&code), Some(5 | 6))
        }
        _ => false,
    }
}

/// Whether the refusal is PgBouncer's: it refuses startup parameters it does not track
/// (sqlx sends `extra_float_digits`), which PostgreSQL itself accepts. Its code is 08P01, a
/// connection error, but no retry changes it.
fn answered_by_pgbouncer(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.message().starts_with("unsupported startup parameter"))
}

/// Refuses a pooler that shares server connections between clients (PgBouncer's transaction
/// or statement pooling, even one told to ignore `extra_float_digits`), before the pool
/// meets it: two connections of this sink open at once each prepare their first statement,
/// and a second prepare of the same name on one server connection fails with
/// `duplicate_prepared_statement` (42P05). On PostgreSQL itself, or a pooler in session mode,
/// each has its own server connection. Other failures are left to the pool, which retries
/// what is transient and reports the rest.
async fn refuse_transaction_pooling(
    options: &AnyConnectOptions,
    shown: &str,
) -> Result<(), DbError> {
    use sqlx::Connection as _;
    let mut held = Vec::new();
    for _ in 0..2 {
        let probe = async {
            let mut connection = sqlx::AnyConnection::connect_with(options).await?;
            sqlx::query("SELECT 1").execute(&mut connection).await?;
            Ok::<_, sqlx::Error>(connection)
        };
        match probe.await {
            Ok(connection) => held.push(connection),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P05") => {
                return Err(DbError::Pooler(shown.to_owned(), db.message().to_owned()));
            }
            Err(error) if answered_by_pgbouncer(&error) => {
                return Err(DbError::Pooler(shown.to_owned(), error.to_string()));
            }
            // Anything else is for the pool's own connection to meet and report.
            Err(_) => break,
        }
    }
    for connection in held {
        let _ = connection.close().await;
    }
    Ok(())
}

/// Whether TLS itself failed, e.g. on a certificate that does not verify (the handshake's
/// error arrives as an I/O error): no retry changes that.
fn tls_refused(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Tls(_)) || podstream_bus::connect::is_tls_failure(error)
}

/// Whose fault a failed statement is, which decides what the sink does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The data of the command in hand (a constraint, a value a column refuses): that
    /// command is dead-lettered with the reason and the rest of its batch applies.
    Command,
    /// The database as a whole (unreachable, read-only, a privilege or a column gone, disk
    /// full, busy): nothing is acked or dead-lettered; the batch is retried until it applies.
    Database,
}

/// Whose fault `error` is. Only what the data of one command can cause is the command's:
/// PostgreSQL's classes 22 (data exception) and 23 (integrity constraint), SQLite's
/// CONSTRAINT, MISMATCH, TOOBIG and RANGE, a value that does not encode or decode. Anything
/// else would fail every command alike, and dead-lettering them would turn an outage into
/// lost commands.
pub fn fault_of(error: &sqlx::Error) -> Fault {
    match error {
        sqlx::Error::Encode(_) | sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } => {
            Fault::Command
        }
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.to_string()).unwrap_or_default();
            let command = match db.kind() {
                sqlx::error::ErrorKind::UniqueViolation
                | sqlx::error::ErrorKind::ForeignKeyViolation
                | sqlx::error::ErrorKind::NotNullViolation
                | sqlx::error::ErrorKind::CheckViolation => true,
                _ => {
                    code.starts_with("22")
                        || code.starts_with("23")
                        || matches!(sqlite_primary_code(&code), Some(18 | 19 | 20 | 25))
                }
            };
            if command {
                Fault::Command
            } else {
                Fault::Database
            }
        }
        _ => Fault::Database,
    }
}

/// SQLite's primary result code of an (extended) code as sqlx reports it; `None` for a
/// PostgreSQL SQLSTATE, which is five characters and never all digits below 256.
fn sqlite_primary_code(code: &str) -> Option<i32> {
    if code.len() == 5 {
        return None;
    }
    code.parse::<i32>().ok().map(|extended| extended & 0xff)
}

#[cfg(test)]
mod tests {
    use super::{Backend, DbError, DbTarget, redacted, sqlite_primary_code};

    /// No URL, however odd, shows its password or makes `redacted` panic.
    #[test]
    fn redacted_urls_never_show_a_password() {
        for (url, shown) in [
            (
                "postgres://airflow:s3cret@db:5432/airflow",
                "postgres://airflow:***@db:5432/airflow",
            ),
            (
                "postgres://airflow@db/airflow",
                "postgres://airflow@db/airflow",
            ),
            (
                "postgres://airflow:p%40ss@db/airflow",
                "postgres://airflow:***@db/airflow",
            ),
            (
                "sqlite:///srv/airflow/airflow.db",
                "sqlite:///srv/airflow/airflow.db",
            ),
            ("user:s3cret@host://db", "user@..."),
            ("s3cret@", "s3cret@..."),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }

    /// A password given apart goes in through the URL parser, encoded; one in the URL wins;
    /// SQLite opens read-write; anything else is a clear error, never a panic.
    #[test]
    fn connect_options_take_the_password_through_the_parser() {
        let with = |url: &str, password: Option<&str>| DbTarget {
            url: url.into(),
            password: password.map(Into::into),
        };
        for (target, backend, url) in [
            (
                with("postgres://airflow@db:5432/airflow", Some("p@ss:w/rd")),
                Backend::Postgres,
                "postgres://airflow:p%40ss%3Aw%2Frd@db:5432/airflow",
            ),
            (
                with("postgresql://airflow:inurl@db/airflow", Some("apart")),
                Backend::Postgres,
                "postgresql://airflow:inurl@db/airflow",
            ),
            (
                with("postgres://airflow@db/airflow", Some("")),
                Backend::Postgres,
                "postgres://airflow@db/airflow",
            ),
            (
                with("sqlite:///srv/airflow.db", None),
                Backend::Sqlite,
                "sqlite:///srv/airflow.db?mode=rw",
            ),
            (
                with("sqlite:///srv/airflow.db?mode=ro", None),
                Backend::Sqlite,
                "sqlite:///srv/airflow.db?mode=ro",
            ),
            // Airflow's sql_alchemy_conn, pasted as it is.
            (
                with("postgresql+psycopg2://airflow@db:5432/airflow", Some("pw")),
                Backend::Postgres,
                "postgresql://airflow:pw@db:5432/airflow",
            ),
            (
                with(
                    "postgresql+asyncpg://airflow:pw@db/airflow?sslmode=require",
                    None,
                ),
                Backend::Postgres,
                "postgresql://airflow:pw@db/airflow?sslmode=require",
            ),
            (
                with("sqlite+pysqlite:////srv/airflow.db", None),
                Backend::Sqlite,
                "sqlite:////srv/airflow.db?mode=rw",
            ),
        ] {
            let (got, options) = target.connect_options().unwrap();
            assert_eq!(got, backend, "{target:?}");
            assert_eq!(options.database_url.as_str(), url, "{target:?}");
        }
        for (target, scheme_error) in [
            (with("mysql://root@db/airflow", None), true),
            (with("user:s3cret@host://db", Some("x")), true),
            (with("not a url", None), false),
            (with("mysql+mysqldb://root:s3cret@db/airflow", None), true),
        ] {
            let error = target.connect_options().unwrap_err();
            assert_eq!(matches!(error, DbError::Scheme(_)), scheme_error, "{error}");
            assert!(!error.to_string().contains("s3cret"), "{error}");
        }
        let shown = format!("{:?}", with("postgres://a:inurl@h/d", Some("apart")));
        assert!(
            !shown.contains("inurl") && !shown.contains("apart"),
            "{shown}"
        );
    }

    /// SQLite reports extended codes; the primary code is the low byte. A PostgreSQL
    /// SQLSTATE is never read as one.
    #[test]
    fn sqlite_codes_are_read_by_their_primary_code() {
        for (code, primary) in [
            ("5", Some(5)),     // BUSY
            ("517", Some(5)),   // BUSY_SNAPSHOT
            ("2067", Some(19)), // CONSTRAINT_UNIQUE
            ("1032", Some(8)),  // READONLY_DBMOVED
            ("13", Some(13)),   // FULL
            ("23505", None),    // PostgreSQL unique_violation
            ("25006", None),    // PostgreSQL read_only_sql_transaction
            ("42P01", None),    // PostgreSQL undefined_table
        ] {
            assert_eq!(sqlite_primary_code(code), primary, "{code}");
        }
    }
}

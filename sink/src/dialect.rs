//! The SQL dialects the sink speaks: which backend, and statement texts and timestamps in
//! its form.

/// Which SQL dialect the database speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL (production).
    Postgres,
    /// SQLite (the embedded default).
    Sqlite,
}

impl Backend {
    /// The backend a URL scheme names: `postgres`, `postgresql` or `sqlite`, alone or with
    /// SQLAlchemy's `+driver` (`postgresql+psycopg2`, `sqlite+pysqlite`).
    pub fn of_scheme(scheme: &str) -> Option<Backend> {
        match scheme
            .split_once('+')
            .map_or(scheme, |(dialect, _)| dialect)
        {
            "postgres" | "postgresql" => Some(Backend::Postgres),
            "sqlite" => Some(Backend::Sqlite),
            _ => None,
        }
    }
}

/// Per-backend SQL: `$n` placeholders become `?n` on SQLite; `{now}` is `now()` on
/// PostgreSQL and, on SQLite, parameter `now_at`, which the caller binds last.
pub(crate) fn sql(backend: Backend, text: &str, now_at: usize) -> String {
    match backend {
        Backend::Postgres => text.replace("{now}", "now()"),
        Backend::Sqlite => text
            .replace('$', "?")
            .replace("{now}", &format!("?{now_at}")),
    }
}

/// Now, as SQLAlchemy writes a datetime into SQLite.
pub(crate) fn sqlite_now() -> String {
    sqlite_timestamp(jiff::Timestamp::now())
}

/// `at` as SQLAlchemy writes a datetime into SQLite (UTC, microseconds): text that
/// sorts as the time does.
pub(crate) fn sqlite_timestamp(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%d %H:%M:%S.%6f").to_string()
}

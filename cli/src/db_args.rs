//! The metadata-database flags shared by `apply`, `sink` and `run`.

use anyhow::Context;
use clap::Args;
use podstream_sink::db::with_password;

/// Where the metadata DB is and how to log in.
#[derive(Debug, Args)]
pub struct DbArgs {
    /// Metadata DB URL: sqlite:///abs/path.db or postgres://user@host:port/db (add
    /// ?sslmode=require, or verify-full&sslrootcert=FILE, for TLS).
    #[arg(long = "db", env = "PODSTREAM_DB")]
    pub db: String,
    /// File holding the database password (kept out of the URL and the process list).
    #[arg(long, env = "PODSTREAM_DB_PASSWORD_FILE")]
    pub db_password_file: Option<std::path::PathBuf>,
}

impl DbArgs {
    /// The URL with the password from `PODSTREAM_DB_PASSWORD` or the password file.
    pub fn url(&self) -> anyhow::Result<String> {
        let password = match &self.db_password_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .trim_end_matches(['\n', '\r'])
                    .to_owned(),
            ),
            None => std::env::var("PODSTREAM_DB_PASSWORD").ok(),
        };
        Ok(with_password(&self.db, password.as_deref()))
    }
}

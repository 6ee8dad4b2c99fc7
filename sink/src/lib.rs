//! Applying podstream's commands to Airflow's metadata database, guarded and exactly once.
//!
//! - [`guard`]: what a command may do to a task instance (the pure core).
//! - `item`: what the sink applies ([`Item`]) and what became of it ([`Outcome`]).
//! - [`db`]: connecting (PostgreSQL or SQLite), telling Airflow 2.10 from 3.1, our tables.
//! - `apply`: one transaction per batch, the command id recorded with its effect; a batch
//!   the database refuses is retried command by command under savepoints.
//! - [`dialect`]: PostgreSQL or SQLite, and SQL and timestamps in each one's form.
//! - `statements`: the fixed texts of a batch's set statements ([`SetStatements`]).
//! - `batch`: a batch applied as those few statements, rows as one JSON parameter.
//! - [`lanes`]: commands applied in parallel transactions, one lane per connection, each TI in
//!   one lane so its commands keep their order.
//! - [`retention`]: how long `podstream_applied` keeps ids, and pruning the older ones.
//! - [`seed`]: DAG runs and TIs written directly, and TIs read back (demo and tests only).
//! - [`summary`]: counts of what happened, in the one line `podstream apply` prints.
//! - [`service`]: `podstream sink`, the durable JetStream consumer.

pub mod airflow;
pub(crate) mod apply;
mod batch;
pub mod db;
pub mod dialect;
pub mod grants;
pub mod guard;
pub(crate) mod item;
pub mod lanes;
pub mod retention;
pub mod seed;
pub mod service;
mod statements;
pub mod summary;

pub use db::Database;
pub use item::{Item, Outcome};
pub use statements::SetStatements;

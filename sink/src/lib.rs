//! Applying podstream's commands to Airflow's metadata database, guarded and exactly once.
//!
//! - [`guard`]: what a command may do to a task instance (the pure core).
//! - [`db`]: connecting (PostgreSQL or SQLite), telling Airflow 2.10 from 3.1, our tables.
//! - [`apply`]: one transaction per batch, a savepoint per command, the command id recorded
//!   with its effect.
//! - [`seed`]: DAG runs and TIs written directly, and TIs read back (demo and tests only).
//! - [`summary`]: counts of what happened, in the one line `podstream apply` prints.
//! - [`service`]: `podstream sink`, the durable JetStream consumer.

pub mod apply;
mod batch;
pub mod db;
pub mod guard;
pub mod seed;
pub mod service;
pub mod summary;

pub use apply::{Item, Outcome};
pub use db::Database;

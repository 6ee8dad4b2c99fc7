//! The rules of docs/semantics.md as a pure core, and the shell that feeds it.
//!
//! - [`rules`]: the phase and deletion table: one event → an [`Outcome`].
//! - `order`: the resourceVersion order rule.
//! - [`duplicates`]: which pod drives a TI when several map to it.
//! - `command`: [`TaskCommand`], a decided command borrowing from its event.
//! - [`decide`](mod@decide): all of the above for one event and the prior state.
//! - [`state`]: the per-pod and per-TI state the rules keep.
//! - [`record`]: the record of one task instance and [`record::TaskRecord::decide`], how
//!   one event changes it (pure), which every shell runs.
//! - `processor`: [`Processor`], the in-process shell, and [`StateStore`]: where its task
//!   records live ([`MemoryStore`]).
//! - `record_cache`: the records this instance wrote last, with their KV revisions.
//! - [`service`]: `podstream process`, what feeds the core from JetStream (start-up, its
//!   handler for the bus's consumer loop, deciding a TI's events); `task_lanes`: which
//!   events of which TI it decides next; `publish`(mod@publish): commands onto JetStream;
//!   `stats`: what it did.
//! - [`spark`]: which Spark driver pod drives a job (its SparkApplication's word, else
//!   `find_spark_job`'s order), and the records it keeps; [`spark::service`]: their consumer
//!   and KV bucket (`--spark`).

pub(crate) mod command;
pub mod decide;
pub mod duplicates;
pub(crate) mod order;
pub(crate) mod processor;
pub(crate) mod publish;
pub mod record;
pub(crate) mod record_cache;
pub mod rules;
pub mod service;
pub mod spark;
pub mod state;
pub(crate) mod stats;
pub(crate) mod task_lanes;

pub use command::TaskCommand;
pub use decide::{Applied, Decision, EventError, decide};
pub use processor::{HandleError, Processor};
pub use processor::{MemoryStore, StateStore};
pub use rules::{Ignored, Outcome, Rules};
pub use state::Prior;

//! The rules of docs/semantics.md as a pure core: a pod event and the prior state in,
//! task-state commands out. Every shell runs it: the processor service, the collector (which
//! judges pods on the same records), `podstream decide` and `podstream replay`.
//!
//! - [`table`]: the phase and deletion table: one event → an [`Outcome`].
//! - `order`: the resourceVersion order rule.
//! - [`duplicates`]: which pod drives a TI when several map to it.
//! - `command`: [`TaskCommand`], a decided command borrowing from its event.
//! - [`decide`](mod@decide): all of the above for one event and the prior state.
//! - [`state`]: the per-pod and per-TI state the rules keep.
//! - [`record`]: the record of one task instance and [`record::TaskRecord::decide`], how
//!   one event changes it, which every shell stores.
//! - `processor`: [`Processor`], the in-process shell, and [`StateStore`]: where its task
//!   records live ([`MemoryStore`]).
//! - [`spark`]: which Spark driver pod drives a job (its SparkApplication's word, else
//!   `find_spark_job`'s order), and the records it keeps.

pub(crate) mod command;
pub mod decide;
pub mod duplicates;
pub(crate) mod order;
pub(crate) mod processor;
pub mod record;
pub mod spark;
pub mod state;
pub mod table;

pub use command::TaskCommand;
pub use decide::{Applied, Decision, EventError, decide};
pub use processor::{HandleError, Processor, warn_unsigned};
pub use processor::{MemoryStore, StateStore};
pub use state::Prior;
pub use table::{Ignored, Outcome, Rules};

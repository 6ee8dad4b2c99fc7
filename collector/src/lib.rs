//! podstream's collector: deletes each worker pod once, at the right time
//! (docs/semantics.md "Collecting worker pods").
//!
//! - [`rule`]: the pure core: where a command tells the collector to look, and what it does
//!   to each pod there, judged on the processor's record of the task instance.
//! - [`pods`]: the two calls to the Kubernetes API (delete on preconditions, label done) and
//!   what their answers mean.
//! - [`service`]: `podstream collect`: the pinned consumer of every owner's commands, its
//!   handler for the bus's consumer loop, and the bucket of pods collected.
//! - [`collected`]: what it did to a pod, as its bucket keeps it for `tail` and `replay`.
//! - `stats`: what it did.

pub mod collected;
pub mod pods;
pub mod rule;
pub mod service;
pub(crate) mod stats;

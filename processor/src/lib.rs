//! `podstream process`: the shell that feeds the rules of [`podstream_rules`] from
//! JetStream and publishes what they decide.
//!
//! - [`service`]: start-up, its handler for the bus's consumer loop, deciding a TI's events;
//!   `task_lanes`: which events of which TI it decides next; `record_cache`: the records this
//!   instance wrote last, with their KV revisions; `publish`(mod@publish): commands onto
//!   JetStream; `stats`: what it did.
//! - [`spark`]: the Spark consumer and its KV bucket (`--spark`).

pub(crate) mod publish;
pub(crate) mod record_cache;
pub mod service;
pub mod spark;
pub(crate) mod stats;
pub(crate) mod task_lanes;

//! The Kubernetes side of podstream.
//!
//! - [`projection`]: a worker `Pod` reduced to the `PodEvent` the rules need,
//!   or a typed reason why it cannot be; `dead_pod`: what a dead letter keeps of a pod it
//!   could not use (never its spec).
//! - [`access`]: the Kubernetes permissions the ingest's calls need, asked before it starts.
//! - [`known`]: what the ingest publishes for each observed pod (the pure core: skips,
//!   owner notices, synthesized deletes).
//! - `listing`: what one watched scope's list is doing (held back or streaming), as a
//!   state machine.
//! - `publisher`: in-order publishing with a bounded ack window; [`checkpoint`]: the KV
//!   checkpoint; [`leadership`]: the Lease that elects one ingest, and its write fence;
//!   [`service`]: `podstream ingest`, the watch loop that ties them together.
//! - `read_ahead`: a watch driven in its own task, read ahead of the publishing loop.
//! - [`pod_json`]: a pod watch event projected straight from JSON, reading only what the
//!   projection needs (`decide`'s fast path), walked by `json_scan`.
//! - [`watched_pod`]: the pod type the ingest watches: projected as it is read, kept as text
//!   only when it cannot be (for its dead letter).
//! - [`watch_json`]: Kubernetes JSON as `kubectl` prints it (watch events,
//!   bare pods, pod lists) read into pods with their event type.
//! - [`spark`]: the watch of Spark driver pods and SparkApplications and what to publish for
//!   each (`--spark`); [`spark::projection`]: one reduced to the `SparkEvent` the choice of
//!   driver reads.

pub mod access;
pub mod checkpoint;
pub(crate) mod dead_pod;
pub(crate) mod json_scan;
pub mod known;
pub mod leadership;
pub(crate) mod listing;
pub mod pod_json;
pub mod projection;
pub(crate) mod publisher;
pub(crate) mod read_ahead;
pub mod service;
pub mod spark;
pub mod watch_json;
pub mod watched_pod;

pub use projection::{ProjectionError, project};

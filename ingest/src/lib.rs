//! The Kubernetes side of podstream.
//!
//! - [`projection`]: a worker `Pod` reduced to the `PodEvent` the rules need,
//!   or a typed reason why it cannot be.
//! - [`watch_json`]: Kubernetes JSON as `kubectl` prints it (watch events,
//!   bare pods, pod lists) read into pods with their event type.

pub mod projection;
pub mod watch_json;

pub use projection::{ProjectionError, project};

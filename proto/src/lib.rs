//! podstream's bus schema and the names that go with it.
//!
//! - [`v1`]: the protobuf types generated from `proto/podstream/v1/podstream.proto`
//!   (`PodEvent`, `Command`, `TaskKey`, `PodRef`).
//! - [`subject`]: subject names on JetStream and the token encoding that makes
//!   any Kubernetes label value exactly one subject token.
//! - [`line`](mod@line): the JSON line form of a command, `podstream decide`'s output
//!   (docs/contract.md §1).
//! - [`msg_id`]: every `Nats-Msg-Id` podstream writes.
//! - [`task`]: conveniences on the TI key and pod reference.
//! - [`revision`]: the order of resourceVersions.
//! - [`signature`]: signed worker pods, the annotation and its HMAC.

pub mod line;
pub mod msg_id;
pub mod revision;
pub mod signature;
pub mod subject;
pub mod task;

/// Types generated from `podstream.v1`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/podstream.v1.rs"));
}

/// The schema, `podstream/v1/podstream.proto`, as an encoded `FileDescriptorSet`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/podstream.binpb"));

pub use task::FATAL_PENDING;
pub use v1::{Command, PodEvent, PodRef, TaskKey};

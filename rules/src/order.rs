//! The order rule: per pod, only an event newer than the last one applied
//! changes anything. The rule itself lives in `podstream_proto::revision`, shared with the
//! ingest.

pub use podstream_proto::revision::is_newer;

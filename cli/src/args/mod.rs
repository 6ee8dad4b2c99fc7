//! The flags the commands share, one file per concern: where NATS, the database and the
//! Kubernetes API are, the Lease, Spark, retention, what the collector deletes, and the metrics
//! endpoint.

pub(crate) mod collect;
pub(crate) mod db;
pub(crate) mod kube;
pub(crate) mod lease;
pub(crate) mod ops;
pub(crate) mod retention;
pub(crate) mod spark;
pub(crate) mod stream;

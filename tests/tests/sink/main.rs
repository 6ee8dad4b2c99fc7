//! The sink on real Airflow databases and as the `podstream sink` service on a real
//! nats-server, by topic: the apply rules (`rules.rs`), the service (`service.rs`), outages
//! (`outages.rs`), behind PgBouncer (`pooler.rs`), pruning applied ids (`retention.rs`);
//! `support.rs` holds what they share.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod grants;
mod outages;
mod pooler;
mod postgres_tls;
mod retention;
mod rules;
mod service;
mod support;

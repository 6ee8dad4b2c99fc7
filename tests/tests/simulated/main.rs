//! The suites on the Kubernetes simulator, a real nats-server and PostgreSQL: each
//! command of the binary, the whole pipeline, the ingest, security, trust and replay. No
//! Airflow scheduler and no kube-apiserver: `scripts/test.sh --fast` runs this tier.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod apply_cli;
mod check_cli;
mod custom_resources;
mod examples;
mod exit_status;
mod ingest;
mod kubectl;
mod leftovers;
mod nats_security;
mod pipeline;
mod process;
mod replay;
mod sim_cli;
mod spark_drivers;
mod streams;
mod tail;
mod timeline;
mod trust;

//! The suites that run Airflow's own code on the simulator: real schedulers with the stock
//! executor and with podstream's, the seed stories, the demo, Airflow's Kubernetes clients,
//! and podstream-airflow's pytest suite in every release.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod airflow_clients;
mod demo;
mod podstream_airflow;
mod podstream_stories;
mod real_airflow;
mod stock_airflow;

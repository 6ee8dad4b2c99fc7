//! The suites on Kubernetes' own kube-apiserver (RBAC and admission on): the ingest and
//! `deploy/` under their roles, the simulator beside the real server, and the seed stories
//! with real Airflow schedulers on it. Tests that need no plane of their own share one
//! (`ControlPlane::shared`), each in a namespace of its own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_apiserver;
mod kube_apiserver_deploy;
mod real_kubernetes_stories;
mod sim_vs_apiserver;

//! `run` and its stages: `ingest`, `process`, `sink` and `collect` each as its own command, and
//! all of them in one process (`pipeline.rs`, for `run` and `demo`).

pub(crate) mod collect;
pub(crate) mod ingest;
pub(crate) mod pipeline;
pub(crate) mod process;
pub(crate) mod run;
pub(crate) mod sink;

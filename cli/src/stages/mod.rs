//! `run` and its stages: `ingest`, `process` and `sink` each as its own command, and all three
//! in one process (`pipeline.rs`, for `run` and `demo`).

pub(crate) mod ingest;
pub(crate) mod pipeline;
pub(crate) mod process;
pub(crate) mod run;
pub(crate) mod sink;

//! The test world, left out of the production build: `demo` (the pipeline on embedded parts,
//! and on a real Airflow), the Kubernetes API simulator and its kubelet.

pub(crate) mod demo;
pub(crate) mod demo_airflow;
pub(crate) mod demo_watcher;
pub(crate) mod kubelet;
pub(crate) mod sim;

//! A Kubernetes API simulator that stock `kubectl` and the `kube` crate use unmodified.
//!
//! It serves core/v1 pods and namespaces, coordination.k8s.io/v1 leases and the custom
//! resources of the definitions it is given, with what podstream
//! and Airflow depend on: one global resourceVersion, list-then-watch, label and field
//! selectors (an object leaving a watch's selection is sent as `DELETED`), graceful deletion
//! (`deletionTimestamp` first, `DELETED` last), bookmarks, paging with consistent snapshots,
//! and `410 Gone` for history that compaction removed.
//!
//! - [`store`]: the versioned objects and the change log (no I/O).
//! - `cluster`: the verbs, deletion timers and the control API tests drive pods with.
//! - [`watch`]: watch streams; `http`: URL layout and query parameters; `server`: serving;
//!   `tls`: its certificate, token and TLS listener.

pub(crate) mod apply;
pub(crate) mod cluster;
pub(crate) mod container;
pub(crate) mod custom;
pub(crate) mod discovery;
pub(crate) mod http;
pub mod kubelet;
pub(crate) mod names;
pub mod object;
pub(crate) mod patch;
pub(crate) mod protobuf;
pub(crate) mod query;
pub mod resource;
pub mod selector;
pub(crate) mod server;
pub(crate) mod status;
pub mod store;
pub(crate) mod table;
pub(crate) mod template;
pub(crate) mod tls;
pub mod watch;

pub use cluster::{Cluster, DeleteOptions, Deletion, ResourceVersionMatch, SimConfig};
pub use container::ContainerState;
pub use custom::CustomResource;
pub use kubelet::{Fault, Kubelet, KubeletConfig};
pub use resource::{Resource, Served};
pub use server::{Server, ServerError};
pub use status::{ApiError, Reason};
pub use template::WorkerPod;
pub use tls::TlsError;

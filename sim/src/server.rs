//! Serving the simulator over HTTP, and the kubeconfig that points clients at it.

use std::net::SocketAddr;
use std::path::Path;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::cluster::{Cluster, SimConfig};
use crate::http::{AppState, router};

/// A running simulator: the cluster and its HTTP server. Dropping it stops the server.
#[derive(Debug)]
pub struct Server {
    cluster: Cluster,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

/// Why the simulator could not serve, or write its kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The cluster could not be made (no Tokio runtime).
    #[error("creating the simulated cluster")]
    Cluster(#[source] crate::status::ApiError),
    /// The address could not be bound.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// The bound address could not be read back.
    #[error("reading the bound address")]
    Address(#[source] std::io::Error),
    /// The kubeconfig could not be written.
    #[error("writing kubeconfig {0}")]
    Kubeconfig(std::path::PathBuf, #[source] std::io::Error),
}

impl Server {
    /// Binds `listen` (port 0 picks a free one) and serves a fresh cluster on it.
    pub async fn start(listen: SocketAddr, config: SimConfig) -> Result<Server, ServerError> {
        let allowed_hosts = config.allowed_hosts.clone();
        let cluster = Cluster::new(config).map_err(ServerError::Cluster)?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|error| ServerError::Bind(listen, error))?;
        let addr = listener.local_addr().map_err(ServerError::Address)?;
        let app = router(AppState {
            cluster: cluster.clone(),
            address: addr.to_string(),
            allowed_hosts,
        });
        // As kube-apiserver (Go's net/http sets TCP_NODELAY): without it, Nagle's algorithm
        // holds each small watch chunk until the client's delayed ACK, tens of milliseconds.
        let listener = listener.tap_io(|tcp| {
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::warn!(%error, "cannot set TCP_NODELAY on a simulator connection");
            }
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let watches = cluster.clone();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
                // Open watches would hold a graceful shutdown forever.
                watches.drop_watches();
            };
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!(%error, "simulator server failed");
            }
        });
        tracing::info!(%addr, "Kubernetes API simulator listening");
        Ok(Server {
            cluster,
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// The simulated cluster, for the control API.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig that kubectl and the `kube` crate use as is.
    pub fn kubeconfig(&self) -> String {
        kubeconfig(&self.url())
    }

    /// Writes the kubeconfig to a file.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), ServerError> {
        std::fs::write(path, self.kubeconfig())
            .map_err(|error| ServerError::Kubeconfig(path.to_owned(), error))
    }

    /// Stops serving: closes watches and waits for the server to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
    }

    /// Serves until the future resolves (for example, a signal), then shuts down.
    pub async fn serve_until(self, signal: impl std::future::Future<Output = ()>) {
        signal.await;
        self.shutdown().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cluster.drop_watches();
        self.task.abort();
    }
}

/// The kubeconfig for a simulator at `url`: one cluster, one context, no credentials.
pub fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: podstream-sim
  cluster:
    server: {url}
contexts:
- name: podstream-sim
  context:
    cluster: podstream-sim
    user: podstream-sim
    namespace: default
current-context: podstream-sim
users:
- name: podstream-sim
  user: {{}}
preferences: {{}}
"
    )
}

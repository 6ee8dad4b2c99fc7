//! Serving the simulator over HTTPS, and the kubeconfig that points clients at it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use base64::Engine as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::cluster::{Cluster, SimConfig};
use crate::http::{AppState, router};
use crate::tls::{Credentials, TlsError, TlsListener};

/// A running simulator: the cluster and its HTTPS server. Dropping it stops the server.
pub struct Server {
    cluster: Cluster,
    addr: SocketAddr,
    ca_pem: String,
    token: String,
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
    /// The certificate or the token could not be made.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The kubeconfig could not be written.
    #[error("writing kubeconfig {0}")]
    Kubeconfig(std::path::PathBuf, #[source] std::io::Error),
}

impl Server {
    /// Binds `listen` (port 0 picks a free one) and serves a fresh cluster on it, over TLS
    /// with a certificate made now, to requests that carry the token made now.
    pub async fn start(listen: SocketAddr, config: SimConfig) -> Result<Server, ServerError> {
        let allowed_hosts = config.allowed_hosts.clone();
        let cluster = Cluster::new(config).map_err(ServerError::Cluster)?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|error| ServerError::Bind(listen, error))?;
        let addr = listener.local_addr().map_err(ServerError::Address)?;
        let credentials = Credentials::new(addr, &allowed_hosts)?;
        let app = router(AppState {
            cluster: cluster.clone(),
            address: addr.to_string(),
            allowed_hosts,
            token: credentials.token.clone().into(),
        });
        let listener = TlsListener::new(listener, addr, credentials.server);
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
            ca_pem: credentials.ca_pem,
            token: credentials.token,
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

    /// `https://host:port`, as a client on this machine reaches it: loopback when the
    /// server listens on every interface (`0.0.0.0`, `::`), a name it answers to.
    pub fn url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("https://{}", SocketAddr::new(ip, self.addr.port()))
    }

    /// The CA that signed the server's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The bearer token every request must carry.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A kubeconfig that kubectl and the `kube` crate use as is: one cluster with the CA,
    /// one context, one user with the token.
    pub fn kubeconfig(&self) -> String {
        let url = self.url();
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let token = &self.token;
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: podstream-sim
  cluster:
    server: {url}
    certificate-authority-data: {ca}
contexts:
- name: podstream-sim
  context:
    cluster: podstream-sim
    user: podstream-sim
    namespace: default
current-context: podstream-sim
users:
- name: podstream-sim
  user:
    token: {token}
preferences: {{}}
"
        )
    }

    /// Writes the kubeconfig to a new file only its owner may read (it holds the token),
    /// replacing an older one, as `podstream run` writes its nats-server's token.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), ServerError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let failed = |error| ServerError::Kubeconfig(path.to_owned(), error);
        let _ = std::fs::remove_file(path);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(failed)?;
        file.write_all(self.kubeconfig().as_bytes()).map_err(failed)
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

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.cluster.drop_watches();
        self.task.abort();
    }
}

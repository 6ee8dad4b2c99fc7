//! The simulator's transport: TLS with a CA and certificate made at start, and the bearer
//! token every request carries (docs/sim.md). Without them any local process, or a web page
//! through DNS rebinding, could create pods that `--kubelet` runs as the simulator's user.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use subtle::ConstantTimeEq as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::server::TlsStream;

/// How long a client may take over its TLS handshake before its connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes finished but not yet taken by the server.
const ACCEPTED_BACKLOG: usize = 64;

/// Why the simulator's certificate or token could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen refused the parameters or could not make a key.
    #[error("making the simulator's certificate")]
    Certificate(#[from] rcgen::Error),
    /// rustls refused the certificate or the protocol versions.
    #[error("configuring TLS")]
    Config(#[from] rustls::Error),
    /// The system's random source failed.
    #[error("reading random bytes for the bearer token")]
    Random,
}

/// What clients need to reach the simulator, and what the server serves with.
pub(crate) struct Credentials {
    /// The CA that signed the server's certificate, PEM: the kubeconfig's
    /// `certificate-authority-data`.
    pub ca_pem: String,
    /// The bearer token every request must carry.
    pub token: String,
    /// The server's TLS configuration (its certificate and key).
    pub server: Arc<ServerConfig>,
}

impl Credentials {
    /// A fresh CA, a server certificate for the loopback names, `addr`'s IP and `hosts`, and
    /// a 256-bit token.
    pub fn new(addr: SocketAddr, hosts: &[String]) -> Result<Credentials, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "podstream sim CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate()?;
        // rcgen makes an IP address SAN of each name that parses as one.
        let mut names = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        for name in std::iter::once(addr.ip().to_string()).chain(hosts.iter().cloned()) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "podstream sim");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &ca)?;

        let provider = Arc::new(ring::default_provider());
        let mut token = [0_u8; 32];
        provider
            .secure_random
            .fill(&mut token)
            .map_err(|_| TlsError::Random)?;
        let mut server = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        // The router speaks HTTP/1.1 only; clients that offer h2 fall back to it.
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Credentials {
            ca_pem: ca_cert.pem(),
            token: token.iter().map(|b| format!("{b:02x}")).collect(),
            server: Arc::new(server),
        })
    }
}

/// Whether `authorization` (the header's value) is `Bearer <token>`, compared in constant time.
pub(crate) fn bearer_matches(authorization: Option<&[u8]>, token: &str) -> bool {
    authorization
        .and_then(|value| value.strip_prefix(b"Bearer "))
        .is_some_and(|given| bool::from(given.ct_eq(token.as_bytes())))
}

/// A TCP listener whose connections are handed to the server once their TLS handshake is
/// done; handshakes run in their own tasks, so a slow client holds up no one else.
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
    acceptor: JoinHandle<()>,
}

impl TlsListener {
    /// Serves TLS with `config` on the bound `listener`.
    pub fn new(listener: TcpListener, addr: SocketAddr, config: Arc<ServerConfig>) -> TlsListener {
        let (handed, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
        let tls = TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(connection) => connection,
                    Err(error) => {
                        // As axum's own listener: out of descriptors and the like pass.
                        tracing::warn!(%error, "accepting a simulator connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // As kube-apiserver (Go's net/http sets TCP_NODELAY): without it, Nagle's
                // algorithm holds each small watch chunk until the client's delayed ACK.
                if let Err(error) = tcp.set_nodelay(true) {
                    tracing::warn!(%error, "cannot set TCP_NODELAY on a simulator connection");
                }
                let tls = tls.clone();
                let handed = handed.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = handed.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "TLS handshake refused");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener {
            accepted,
            addr,
            acceptor,
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The acceptor only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

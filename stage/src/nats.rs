//! A real `nats-server` with JetStream for a test: a free port, a temp storage dir, stop and
//! restart on the same dir. The launcher is `podstream run`'s own (`podstream_bus::local_server`).

use std::path::PathBuf;

use podstream_bus::local_server::LocalServer;

use crate::{free_port, workspace_root};

/// The `nats-server` binary: `$PODSTREAM_NATS_SERVER`, else the one `scripts/setup.sh`
/// installs under `target/tools/bin`, else `nats-server` on PATH.
pub fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PODSTREAM_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let installed = workspace_root().join("target/tools/bin/nats-server");
    if installed.exists() {
        return installed;
    }
    PathBuf::from("nats-server")
}

/// A running (or stopped) nats-server owned by the test.
pub struct NatsServer {
    server: LocalServer,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server with JetStream on a free port and a fresh storage dir.
    ///
    /// # Panics
    /// When it cannot start: every test that asks for one needs it.
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let server = LocalServer::start(&nats_server_binary(), dir.path(), free_port())
            .unwrap_or_else(|e| panic!("{e}"));
        NatsServer { server, _dir: dir }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// Stops the server gracefully (SIGTERM), keeping its storage.
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Starts it again on the same port and storage.
    ///
    /// # Panics
    /// When it cannot start again.
    pub fn restart(&mut self) {
        self.server.restart().unwrap_or_else(|e| panic!("{e}"));
    }
}

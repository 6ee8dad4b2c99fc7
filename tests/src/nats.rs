//! A real `nats-server` with JetStream for a test: a free port, a temp storage dir, stop and
//! restart on the same dir.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server with JetStream on a free port and a fresh storage dir.
    ///
    /// # Panics
    /// When it cannot start: every test that asks for one needs it.
    pub fn start() -> NatsServer {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let mut server = NatsServer {
            child: None,
            port,
            dir,
        };
        server.launch();
        server
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn launch(&mut self) {
        let log = self.dir.path().join("nats-server.log");
        let store = self.dir.path().join("jetstream");
        let child = Command::new(nats_server_binary())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&store)
            .arg("-l")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nats-server (scripts/setup.sh installs it): {e}")
            });
        self.child = Some(child);
        let started = Instant::now();
        loop {
            let ready = std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Server is ready"));
            if ready {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "nats-server did not become ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server gracefully (SIGTERM), keeping its storage.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and storage.
    pub fn restart(&mut self) {
        self.stop();
        // The log is appended to; wait for a fresh "ready" line.
        let log = self.dir.path().join("nats-server.log");
        let _ = std::fs::remove_file(&log);
        self.launch();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

//! What every end-to-end test needs: the fixtures and the built `podstream`
//! binary. (Launchers for nats-server, PostgreSQL and the Kubernetes
//! simulator join here with the issues that bring those parts.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// A file under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The `podstream` binary: `$PODSTREAM_BIN` when set, otherwise built once
/// per test process with `cargo build` into the workspace's target dir.
///
/// # Panics
/// When the binary cannot be built: every end-to-end test needs it.
pub fn podstream_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("PODSTREAM_BIN") {
            return PathBuf::from(path);
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "podstream-cli",
                "--bin",
                "podstream",
            ])
            .current_dir(workspace_root())
            .status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "cannot build the podstream binary: {status:?}"
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| workspace_root().join("target"), PathBuf::from);
        target.join("debug").join("podstream")
    })
}

/// A running `kubectl` watch whose JSON output is parsed as it arrives.
pub struct KubectlWatch {
    child: std::process::Child,
    events: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl KubectlWatch {
    /// Runs `kubectl --kubeconfig FILE <args>` and parses its stdout as a stream of JSON values.
    ///
    /// # Panics
    /// When kubectl cannot be started.
    pub fn start(kubeconfig: &Path, args: &[&str]) -> KubectlWatch {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run kubectl (scripts/setup.sh installs it): {e}"));
        let (tx, events) = std::sync::mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                let values =
                    serde_json::Deserializer::from_reader(stdout).into_iter::<serde_json::Value>();
                for value in values.map_while(Result::ok) {
                    if tx.send(value).is_err() {
                        break;
                    }
                }
            });
        }
        KubectlWatch { child, events }
    }

    /// The next printed value, or `None` after 15 s.
    pub fn next(&self) -> Option<serde_json::Value> {
        self.events
            .recv_timeout(std::time::Duration::from_secs(15))
            .ok()
    }
}

impl Drop for KubectlWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `kubectl --kubeconfig FILE <args>` to completion: (success, stdout, stderr).
///
/// # Panics
/// When kubectl cannot be started.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kubectl (scripts/setup.sh installs it): {e}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Whether the kubectl on PATH has `patch --subresource` (kubectl ≥ 1.24).
pub fn kubectl_has_subresource_flag() -> bool {
    Command::new("kubectl")
        .args(["patch", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--subresource"))
        .unwrap_or(false)
}

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

//! A stage for real Airflow: PostgreSQL restored from the cached `airflow db migrate` dump
//! ([`postgres`]), `podstream sim --kubelet`, a real `nats-server` ([`nats`]), Airflow's own
//! components from the venvs `scripts/setup.sh` installs ([`airflow`], [`real_airflow`]), and
//! the seed stories played on it ([`stories`]).
//!
//! It serves the end-to-end tests and `podstream demo --airflow`, in a checkout after
//! `scripts/setup.sh`. Like a test, a step that cannot go on panics with the timeline and the
//! logs; the demo plays each story on a thread of its own and reports such a panic as that
//! story's outcome.

pub mod airflow;
pub mod control_plane;
pub mod nats;
pub mod pki;
pub mod postgres;
pub mod real_airflow;
pub mod stories;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root (the checkout this crate was built from).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

static BINARY: OnceLock<PathBuf> = OnceLock::new();

/// What a watcher kills once this process has ended.
#[derive(Debug, Clone, Copy)]
pub enum Doomed {
    /// One process.
    Process(u32),
    /// A process group (a server and the children it keeps in its group).
    Group(u32),
}

/// Starts a watcher, in a session of its own, that kills `doomed` with SIGKILL once this
/// process has ended. A test process killed outright (a CI timeout, a Ctrl-C on the suite)
/// drops nothing, yet the servers it started must not outlive it; a watcher whose target
/// already ended kills nothing of note and exits too.
pub fn kill_when_this_process_ends(doomed: Doomed) {
    let target = match doomed {
        Doomed::Process(pid) => pid.to_string(),
        Doomed::Group(group) => format!("-{group}"),
    };
    // dash, Debian's sh, takes no `--` before a negative (group) id.
    when_this_process_ends(
        &format!("kill -9 {target} 2>/dev/null"),
        &format!("{doomed:?}"),
    );
}

/// Starts a watcher that removes `dir` once this process has ended (a shared server's data,
/// which no drop removes), after its servers' watchers have killed them.
pub fn remove_when_this_process_ends(dir: &Path) {
    let dir = dir.display();
    when_this_process_ends(&format!("sleep 2; rm -rf '{dir}'"), &dir.to_string());
}

/// Runs the shell command `then` once this process has ended, from a watcher in a session of
/// its own: a signal to the test's process group does not end it first.
fn when_this_process_ends(then: &str, what: &str) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {then}",
        pid = std::process::id(),
    );
    let spawned = Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(error) = spawned {
        eprintln!("no watcher for {what}: {error}");
    }
}

/// Makes `path` the `podstream` binary the stage runs (the demo passes its own), if none was
/// chosen yet.
pub fn use_podstream_binary(path: PathBuf) {
    let _ = BINARY.set(path);
}

/// The `podstream` binary: the one [`use_podstream_binary`] chose, else `$PODSTREAM_BIN`,
/// else built once per process with `cargo build` into the workspace's target dir.
///
/// # Panics
/// When the binary cannot be built: every end-to-end test needs it.
pub fn podstream_binary() -> &'static Path {
    BINARY.get_or_init(|| match std::env::var_os("PODSTREAM_BIN") {
        Some(path) => PathBuf::from(path),
        None => build_podstream(false),
    })
}

/// Builds the `podstream` binary with cargo (`release` or dev profile); returns its path.
///
/// # Panics
/// When it cannot be built.
pub fn build_podstream(release: bool) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec![
        "build",
        "--quiet",
        "-p",
        "podstream-cli",
        "--bin",
        "podstream",
    ];
    if release {
        args.push("--release");
    }
    let status = Command::new(cargo)
        .args(&args)
        .current_dir(workspace_root())
        .status();
    assert!(
        matches!(status, Ok(s) if s.success()),
        "cannot build the podstream binary: {status:?}"
    );
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from);
    target
        .join(if release { "release" } else { "debug" })
        .join("podstream")
}

/// Runs the kubectl `scripts/setup.sh` builds, `kubectl --kubeconfig FILE <args>`, to
/// completion: (success, stdout, stderr).
///
/// # Panics
/// When kubectl cannot be started.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    control_plane::kubectl_with_input(kubeconfig, args, "")
}

/// 32 hex digits from the kernel's random source: a token or password made for one run.
///
/// # Panics
/// When /dev/urandom cannot be read.
pub fn random_token() -> String {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .unwrap_or_else(|e| panic!("/dev/urandom: {e}"));
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A TCP port that is free on 127.0.0.1 now (for servers the stage starts).
///
/// # Panics
/// When the OS has none to give.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

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
/// already ended kills nothing and exits too.
///
/// Pids wrap quickly on a test machine (`pid_max` is often 32768), so the watcher knows each
/// process by its pid and its start time: an ended test's pid or an ended target's pid taken
/// by the next test's process is neither waited for nor killed.
pub fn kill_when_this_process_ends(doomed: Doomed) {
    let (pid, group) = match doomed {
        Doomed::Process(pid) => (pid, ""),
        Doomed::Group(leader) => (leader, "-"),
    };
    let Some(started) = start_time(pid) else {
        return; // already gone: nothing to kill.
    };
    // A group outlives its leader only while it has members, and a pgid in use is never a
    // new pid: with the leader gone, whatever still holds the group is ours.
    let kill = match doomed {
        Doomed::Process(_) => format!("same {pid} {started} && kill -9 {pid}"),
        Doomed::Group(_) => format!(
            "if [ -e /proc/{pid} ]; then same {pid} {started} && kill -9 -{pid}; \
             else kill -9 -{pid}; fi"
        ),
    };
    // dash, Debian's sh, takes no `--` before a negative (group) id.
    when_this_process_ends(&format!("{kill} 2>/dev/null"), &format!("{group}{pid}"));
}

/// Starts a watcher that removes `dir` once this process has ended (a shared server's data,
/// which no drop removes), after its servers' watchers have killed them.
pub fn remove_when_this_process_ends(dir: &Path) {
    let dir = dir.display();
    when_this_process_ends(&format!("sleep 2; rm -rf '{dir}'"), &dir.to_string());
}

/// A process's start time (clock ticks since boot, `/proc/<pid>/stat` field 22): with its pid,
/// what tells it from a later process given the same pid.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the fields after its last
    // `)` start at field 3.
    let (_, after_name) = stat.rsplit_once(") ")?;
    after_name.split_whitespace().nth(19).map(str::to_owned)
}

/// The shell function `same PID START`: whether PID is still the process that started at
/// START (the same reading as [`start_time`]).
const SAME_PROCESS: &str =
    "same() { [ \"$(sed 's/.*) //' /proc/$1/stat 2>/dev/null | cut -d' ' -f20)\" = \"$2\" ]; }";

/// Runs the shell command `then` once this process has ended, from a watcher in a session of
/// its own: a signal to the test's process group does not end it first. `then` may call
/// `same` ([`SAME_PROCESS`]).
pub(crate) fn when_this_process_ends(then: &str, what: &str) {
    let me = std::process::id();
    let Some(started) = start_time(me) else {
        eprintln!("no watcher for {what}: /proc/{me}/stat is unreadable");
        return;
    };
    let script = format!("{SAME_PROCESS}; while same {me} {started}; do sleep 1; done; {then}");
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Whether the watcher's shell function takes `pid` for the process that started at `start`.
    fn shell_says_same(pid: u32, start: &str) -> bool {
        Command::new("sh")
            .args(["-c", &format!("{SAME_PROCESS}; same {pid} {start}")])
            .status()
            .unwrap()
            .success()
    }

    #[test]
    fn the_watcher_knows_a_process_by_pid_and_start_time() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let started = start_time(pid).expect("a live child has a start time");
        let later: u64 = started.parse::<u64>().unwrap() + 1;
        let verdicts = (
            shell_says_same(pid, &started),
            shell_says_same(pid, &later.to_string()),
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(verdicts, (true, false), "same pid, then a later start time");
        assert!(
            !shell_says_same(pid, &started),
            "an ended process is not the same"
        );
        assert_eq!(start_time(pid), None);
    }
}

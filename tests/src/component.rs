//! A `podstream` component as its own process, to be killed with SIGKILL and started again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `podstream` child process; SIGKILLed when dropped.
pub struct Component {
    child: Child,
    binary: PathBuf,
    args: Vec<String>,
    kubeconfig: String,
}

impl Component {
    /// Starts `binary args` with `KUBECONFIG=kubeconfig` and `PODSTREAM_LOG` (default `warn`).
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn start(binary: &Path, args: &[&str], kubeconfig: &Path) -> Component {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let kubeconfig = kubeconfig.display().to_string();
        let child = spawn(binary, &args, &kubeconfig);
        Component {
            child,
            binary: binary.to_owned(),
            args,
            kubeconfig,
        }
    }

    /// SIGKILL, and waits until the process is gone.
    ///
    /// # Panics
    /// When the signal cannot be sent.
    pub fn kill(&mut self) {
        self.child
            .kill()
            .unwrap_or_else(|e| panic!("killing {:?}: {e}", self.args));
        let _ = self.child.wait();
    }

    /// The same command again, after [`Component::kill`].
    pub fn restart(&mut self) {
        self.child = spawn(&self.binary, &self.args, &self.kubeconfig);
    }

    /// SIGKILL, then the same command again.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// SIGTERM; the exit status.
    ///
    /// # Panics
    /// When it does not stop within 20 s.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{:?} did not stop on SIGTERM",
                self.args
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(binary: &Path, args: &[String], kubeconfig: &str) -> Child {
    Command::new(binary)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env(
            "PODSTREAM_LOG",
            std::env::var("PODSTREAM_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {args:?}: {e}", binary.display()))
}

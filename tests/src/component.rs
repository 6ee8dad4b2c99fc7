//! A `podstream` component as its own process, to be killed with SIGKILL and started again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The simulator's namespace for worker pods, which the rigs' components watch.
pub const NS: &str = "airflow";

/// A `podstream` child process; SIGKILLed when dropped.
pub struct Component {
    child: Child,
    binary: PathBuf,
    args: Vec<String>,
    kubeconfig: String,
    env: Vec<(String, String)>,
}

impl Component {
    /// Starts `binary args` with `KUBECONFIG=kubeconfig` and `PODSTREAM_LOG` (default `warn`).
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn start(binary: &Path, args: &[&str], kubeconfig: &Path) -> Component {
        Component::start_with_env(binary, args, kubeconfig, &[])
    }

    /// `podstream run` of this tree on NATS at `nats` and the database at `db`, watching the
    /// simulator's namespace ([`NS`]), with `more` flags.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn run(nats: &str, db: &str, kubeconfig: &Path, more: &[&str]) -> Component {
        let mut args = vec!["run", "--nats", nats, "--db", db, "--namespaces", NS];
        args.extend_from_slice(more);
        Component::start(crate::podstream_binary(), &args, kubeconfig)
    }

    /// [`Component::start`] with more environment variables, kept for restarts.
    ///
    /// # Panics
    /// When it cannot be started.
    pub fn start_with_env(
        binary: &Path,
        args: &[&str],
        kubeconfig: &Path,
        env: &[(&str, &str)],
    ) -> Component {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let kubeconfig = kubeconfig.display().to_string();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let child = spawn(binary, &args, &kubeconfig, &env);
        Component {
            child,
            binary: binary.to_owned(),
            args,
            kubeconfig,
            env,
        }
    }

    /// The process id of the running process.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`).
    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status();
    }

    /// The exit status if the process ends within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
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
        self.child = spawn(&self.binary, &self.args, &self.kubeconfig, &self.env);
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
        self.stop()
    }

    /// SIGTERM; the exit status. The command stays, for [`Component::restart`].
    ///
    /// # Panics
    /// When it does not stop within 20 s.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        let args = self.args.clone();
        self.wait_exit(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{args:?} did not stop on SIGTERM"))
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(binary: &Path, args: &[String], kubeconfig: &str, env: &[(String, String)]) -> Child {
    let child = Command::new(binary)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", kubeconfig)
        .env(
            "PODSTREAM_LOG",
            std::env::var("PODSTREAM_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {args:?}: {e}", binary.display()));
    podstream_stage::kill_when_this_process_ends(podstream_stage::Doomed::Process(child.id()));
    child
}

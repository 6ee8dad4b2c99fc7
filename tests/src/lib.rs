//! What every end-to-end test needs: the fixtures, the built `podstream`
//! binary, a real `nats-server` ([`nats`]), the kubectl `scripts/setup.sh` builds, the
//! Kubernetes API simulator (through `podstream_sim::Server`) and the real control plane
//! ([`control_plane`]).

pub mod browser;
pub mod bus;
pub mod component;
pub mod ingest;
pub mod recovery;
pub mod sink;

pub use podstream_stage::{
    airflow, control_plane, free_port, kubectl, nats, pki, podstream_binary, postgres,
    real_airflow, stories, workspace_root,
};

use std::path::{Path, PathBuf};
use std::process::Command;

/// A throwaway dir two levels inside the workspace (`tests/<prefix>…`), so a kustomization
/// there reaches deploy/ as `../../deploy`, as kustomize wants. Not under `target/`, which may
/// be a link (kustomize resolves links), nor a dot-named dir, which checkov skips.
///
/// # Panics
/// When the dir cannot be made.
pub fn overlay_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(workspace_root().join("tests"))
        .unwrap_or_else(|e| panic!("a dir under tests/: {e}"))
}

/// The statements of docs/install.md's step 2 (the sink's PostgreSQL role), one per item,
/// comments dropped: the suite runs them as the page gives them.
///
/// # Panics
/// When the page has no such step.
pub fn install_page_sql() -> Vec<String> {
    let page = std::fs::read_to_string(workspace_root().join("docs/install.md"))
        .unwrap_or_else(|e| panic!("docs/install.md: {e}"));
    let step = page
        .split_once("## 2. PostgreSQL")
        .unwrap_or_else(|| panic!("install.md has no PostgreSQL step"))
        .1;
    let block = step
        .split_once("```sql\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("install.md's PostgreSQL step has no SQL block"))
        .0;
    block
        .lines()
        .map(|line| line.split_once("--").map_or(line, |(sql, _)| sql).trim())
        .collect::<Vec<_>>()
        .join(" ")
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A file under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// The release `podstream` binary, built with `cargo build --release` (for benchmarks).
///
/// # Panics
/// When it cannot be built.
pub fn podstream_release_binary() -> PathBuf {
    podstream_stage::build_podstream(true)
}

/// The variable naming the binary a measuring bench runs instead of this tree's release build.
pub const BENCH_BINARY: &str = "PODSTREAM_BENCH_BINARY";

/// A bench's numeric option `flag N` from its command line, else `default`.
///
/// # Panics
/// When the value after `flag` is not a number.
pub fn bench_option(flag: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|e| panic!("{flag} takes a number, not {v:?}: {e}"))
        })
}

/// The multi-threaded Tokio runtime a bench's `main` runs in.
///
/// # Panics
/// When the runtime cannot be built.
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("building the Tokio runtime: {e}"))
}

/// The binary a bench runs: the release build for a measuring run (`cargo bench`), the test
/// build for the quick check `cargo test --benches` makes. `PODSTREAM_BENCH_BINARY` names
/// another one for a measuring run, such as an earlier commit's build for a baseline.
///
/// # Panics
/// When it cannot be built.
pub fn bench_binary(measuring: bool) -> PathBuf {
    if measuring {
        match std::env::var_os(BENCH_BINARY) {
            Some(path) => PathBuf::from(path),
            None => podstream_release_binary(),
        }
    } else {
        podstream_binary().to_path_buf()
    }
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
        let mut child = Command::new(podstream_stage::control_plane::tool("kubectl"))
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

/// Whether the kubectl on PATH has `patch --subresource` (kubectl ≥ 1.24).
pub fn kubectl_has_subresource_flag() -> bool {
    Command::new(podstream_stage::control_plane::tool("kubectl"))
        .args(["patch", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--subresource"))
        .unwrap_or(false)
}

/// A simulator serving the `airflow` namespace, with its kubeconfig in a scratch directory.
pub struct Sim {
    /// The running simulator.
    pub server: podstream_sim::Server,
    /// Its kubeconfig, for kubectl and the kube crate.
    pub kubeconfig: PathBuf,
    /// The scratch directory, removed on drop.
    pub dir: tempfile::TempDir,
}

/// Starts a [`Sim`]; with `spark`, it also serves SparkApplications (sim/crds/).
///
/// # Panics
/// When it cannot start.
pub async fn sim(spark: bool) -> Sim {
    let custom_resources = if spark {
        let crd = workspace_root().join("sim/crds/sparkapplications.yaml");
        vec![podstream_sim::CustomResource::load(&crd).unwrap_or_else(|e| panic!("{e}"))]
    } else {
        Vec::new()
    };
    let config = podstream_sim::SimConfig {
        namespaces: vec!["airflow".into()],
        custom_resources,
        ..podstream_sim::SimConfig::default()
    };
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let server = podstream_sim::Server::start(address, config)
        .await
        .unwrap_or_else(|e| panic!("starting the simulator: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let kubeconfig = dir.path().join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .unwrap_or_else(|e| panic!("writing the kubeconfig: {e}"));
    Sim {
        server,
        kubeconfig,
        dir,
    }
}

/// A kube client for a simulator, configured from the kubeconfig it writes.
///
/// # Panics
/// When the kubeconfig does not load: the simulator writes it itself.
pub async fn kube_client(server: &podstream_sim::Server) -> kube::Client {
    kube_client_of(&server.kubeconfig()).await
}

/// A kube client configured from a kubeconfig's text (the simulator's, or the control
/// plane's).
///
/// # Panics
/// When the kubeconfig does not load.
pub async fn kube_client_of(kubeconfig: &str) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap_or_else(|e| panic!("kube config: {e}"));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("kube client: {e}"))
}

/// Sends `tracing` output of the code under test to the test's captured output, filtered by
/// `PODSTREAM_LOG` (default `warn`). Safe to call from every test.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PODSTREAM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// The CPU time a process has used so far, as `/proc/<pid>/stat` shows it, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessCpu {
    /// Its process group.
    pub group: u32,
    /// Its own user and system time (all its threads).
    pub own: f64,
    /// The user and system time of the children it has waited for.
    pub reaped_children: f64,
}

impl ProcessCpu {
    /// Process `pid`'s; `None` when it is gone.
    pub fn of(pid: u32) -> Option<ProcessCpu> {
        ProcessCpu::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// Every process's on the machine now.
    pub fn all() -> Vec<ProcessCpu> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(ProcessCpu::of)
            .collect()
    }

    /// Parsed from the text of a `/proc/<pid>/stat`.
    pub fn parse(stat: &str) -> Option<ProcessCpu> {
        // After the command name, which may hold spaces and ends at the last ')': the process
        // group is the 3rd field; utime, stime, cutime and cstime the 12th to 15th, in ticks.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
        let per_second = clock_ticks();
        Some(ProcessCpu {
            group: fields.get(2)?.parse().ok()?,
            own: (ticks(11)? + ticks(12)?) / per_second,
            reaped_children: (ticks(13)? + ticks(14)?) / per_second,
        })
    }

    /// Its own time and its reaped children's.
    pub fn with_children(self) -> f64 {
        self.own + self.reaped_children
    }
}

/// Clock ticks a second, the unit of `/proc/<pid>/stat`'s times.
fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// CPU time (user and system) process `pid` has used so far, in seconds (0 when unreadable).
pub fn cpu_seconds(pid: u32) -> f64 {
    ProcessCpu::of(pid).map_or(0.0, |cpu| cpu.own)
}

/// Resident and peak memory of process `pid`, in MB (0 when unreadable).
pub fn rss_mb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `GET path` on `address` over plain HTTP/1.1: the status and the body, or `None` when
/// nothing answers.
pub fn http_get(address: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&address, std::time::Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Some((status, body))
}

/// The value of the first sample of `metric` in Prometheus text whose line contains every
/// one of `labels` (`name="value"`), summed over the matching lines.
pub fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.split(['{', ' '])
                .next()
                .is_some_and(|name| name == metric)
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The JSON forms users feed `podstream decide`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonForm {
    /// One value per line, no whitespace: what the apiserver sends.
    Compact,
    /// One value per line, a space after each `:` and `,`: Python's default `json.dumps`.
    Python,
    /// Pretty-printed with a four-space indent: what `kubectl ... -o json -w` prints.
    Kubectl,
}

impl JsonForm {
    /// Every form, compact first.
    pub const ALL: [JsonForm; 3] = [JsonForm::Compact, JsonForm::Python, JsonForm::Kubectl];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            JsonForm::Compact => "compact",
            JsonForm::Python => "python-default",
            JsonForm::Kubectl => "kubectl-pretty",
        }
    }

    /// Appends `value` in this form to `out`, and a newline.
    ///
    /// # Panics
    /// Never for a `serde_json::Value` (its serialization cannot fail into a `Vec`).
    pub fn write(self, value: &serde_json::Value, out: &mut Vec<u8>) {
        use serde::Serialize as _;
        let written = match self {
            JsonForm::Compact => value.serialize(&mut serde_json::Serializer::new(&mut *out)),
            JsonForm::Python => value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut *out,
                PythonDefault,
            )),
            JsonForm::Kubectl => value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut *out,
                serde_json::ser::PrettyFormatter::with_indent(b"    "),
            )),
        };
        written.unwrap_or_else(|e| panic!("serializing a JSON value: {e}"));
        out.push(b'\n');
    }
}

/// Python's default `json.dumps`: a space after each `:` and `,`.
struct PythonDefault;

/// `, ` before every element of an array or an object but the first.
fn python_separator<W: ?Sized + std::io::Write>(
    writer: &mut W,
    first: bool,
) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        writer.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for PythonDefault {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        python_separator(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        python_separator(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::ProcessCpu;

    #[test]
    fn a_stat_line_gives_its_group_and_cpu_times_whatever_its_command_name() {
        // A command name with spaces and a ')' of its own; utime 250, stime 50, cutime 100,
        // cstime 20 ticks.
        let stat = "4242 (airflow sched) (x)) S 1 4242 4242 0 -1 4194560 9 0 0 0 \
                    250 50 100 20 20 0 3 0 123 0 0";
        let cpu = ProcessCpu::parse(stat).unwrap();
        let ticks = super::clock_ticks();
        assert_eq!(cpu.group, 4242);
        assert!((cpu.own - 300.0 / ticks).abs() < 1e-9, "{cpu:?}");
        assert!(
            (cpu.reaped_children - 120.0 / ticks).abs() < 1e-9,
            "{cpu:?}"
        );
        assert!((cpu.with_children() - 420.0 / ticks).abs() < 1e-9);
        assert_eq!(ProcessCpu::parse("4242 (cut short) S 1"), None);
    }

    #[test]
    fn this_process_is_among_all() {
        let me = ProcessCpu::of(std::process::id()).unwrap();
        assert!(ProcessCpu::all().iter().any(|cpu| cpu.group == me.group));
    }
}

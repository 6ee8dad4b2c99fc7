//! A real Kubernetes control plane for the suite: etcd and kube-apiserver of the release that
//! `scripts/kubernetes-tools.sh` builds from their Go modules, with RBAC and admission on
//! (ValidatingAdmissionPolicy among the plugins), an admin token, and service account tokens
//! by TokenRequest.
//!
//! No controller manager runs, so [`ControlPlane::namespace`] makes a namespace's `default`
//! service account itself, as the controller would; and no kubelet runs unless a test attaches
//! one: pods stay Pending and unbound until something writes their status.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::pki::Pki;
use crate::{free_port, workspace_root};

/// Where `scripts/kubernetes-tools.sh` puts the binaries it builds.
pub fn tools_dir() -> PathBuf {
    workspace_root().join("target/tools/kubernetes/bin")
}

/// One of the built binaries: `kube-apiserver`, `kube-scheduler`, `kubectl`, `etcd` or `helm`.
pub fn tool(name: &str) -> PathBuf {
    tools_dir().join(name)
}

/// The Kubernetes release the suite runs, as `tools/kubernetes/go.mod` pins it.
pub fn release() -> String {
    let pins = std::fs::read_to_string(workspace_root().join("tools/kubernetes/go.mod"))
        .unwrap_or_default();
    pins.lines()
        .find_map(|line| line.strip_prefix("require k8s.io/kubernetes "))
        .unwrap_or("unknown")
        .trim()
        .to_owned()
}

/// How a control plane runs, where a test needs it otherwise than the default.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The API server's watch cache (on by default, as in every cluster). Off, a watch from a
    /// resourceVersion reads etcd's history, so one that etcd compacted away gets `410 Gone`
    /// at once, as a cluster's does once its cache's window has moved past it.
    pub watch_cache: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { watch_cache: true }
    }
}

/// What the API server's audit log keeps: who did what to which object, for requests of
/// service accounts (podstream's components, and the Airflow schedulers a test runs as one).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: [\"system:serviceaccounts\"]
  - level: None
";

/// One request in the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    /// Who made it (`system:serviceaccount:<namespace>:<name>` for a service account).
    pub user: String,
    /// The verb (`list`, `watch`, `get`, `create`, `update`, `patch`, `delete`).
    pub verb: String,
    /// The object's API group (`""` for the core group).
    pub group: String,
    /// The resource, plural, with `/subresource` where there is one.
    pub resource: String,
    /// The object's namespace, where it has one.
    pub namespace: String,
    /// The object's name, where the request names one.
    pub name: String,
    /// The answer's HTTP status.
    pub code: u16,
    /// When the API server logged it (the answer started or completed).
    pub at: Option<time::OffsetDateTime>,
}

/// The user the admin token authenticates as (in `system:masters`).
pub const ADMIN: &str = "podstream-admin";

/// A running etcd and kube-apiserver; dropping it stops both and removes their data.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    etcd: Child,
    apiserver: Child,
    etcd_port: u16,
    url: String,
    admin: PathBuf,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

static SHARED: OnceLock<ControlPlane> = OnceLock::new();
static NAMESPACES: AtomicU32 = AtomicU32::new(0);

impl ControlPlane {
    /// The control plane this test process shares (started on first use, ended with the
    /// process): each test takes a namespace of its own ([`ControlPlane::namespace`]).
    pub fn shared() -> &'static ControlPlane {
        SHARED.get_or_init(|| ControlPlane::start(Options::default()))
    }

    /// Starts etcd and kube-apiserver on free loopback ports and waits until the API server
    /// is ready.
    ///
    /// # Panics
    /// When a binary is missing (`scripts/setup.sh` builds them) or a server does not become
    /// ready, with its log.
    pub fn start(options: Options) -> ControlPlane {
        for name in ["etcd", "kube-apiserver", "kubectl"] {
            assert!(
                tool(name).is_file(),
                "{} is missing: scripts/setup.sh builds it",
                tool(name).display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("podstream-control-plane-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir: {e}"));
        crate::remove_when_this_process_ends(dir.path());
        let pki = Pki::new();
        let (signer, verifier) = pki.key_pair("service-accounts");
        let token = crate::random_token();
        let audit_policy = dir.path().join("audit-policy.yaml");
        write(&audit_policy, AUDIT_POLICY);
        let tokens = dir.path().join("tokens.csv");
        write(
            &tokens,
            &format!("{token},{ADMIN},{ADMIN},system:masters\n"),
        );

        let etcd_port = free_port();
        let peer_port = free_port();
        let etcd = spawn(
            Command::new(tool("etcd"))
                .arg("--name=podstream-test")
                .arg(format!("--data-dir={}", dir.path().join("etcd").display()))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
                .arg(format!(
                    "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
                ))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
                ))
                .arg(format!(
                    "--initial-cluster=podstream-test=http://127.0.0.1:{peer_port}"
                ))
                // A test's data need not survive a power cut; fsyncs would dominate its time.
                .arg("--unsafe-no-fsync")
                .arg("--log-level=warn"),
            &dir.path().join("etcd.log"),
        );

        let port = free_port();
        let apiserver = spawn(
            Command::new(tool("kube-apiserver"))
                .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
                .arg("--bind-address=127.0.0.1")
                .arg("--advertise-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", dir.path().join("certs").display()))
                .arg(format!(
                    "--tls-cert-file={}",
                    pki.path("server.pem").display()
                ))
                .arg(format!(
                    "--tls-private-key-file={}",
                    pki.path("server-key.pem").display()
                ))
                .arg(format!("--client-ca-file={}", pki.path("ca.pem").display()))
                .arg(format!("--token-auth-file={}", tokens.display()))
                .arg("--authorization-mode=RBAC")
                .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
                .arg(format!("--service-account-key-file={}", verifier.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    signer.display()
                ))
                .arg("--service-cluster-ip-range=10.0.0.0/24")
                // The `kubernetes` Service would list 127.0.0.1, which Endpoints refuse.
                .arg("--endpoint-reconciler-type=none")
                .arg(format!("--watch-cache={}", options.watch_cache))
                .arg(format!("--audit-policy-file={}", audit_policy.display()))
                .arg(format!(
                    "--audit-log-path={}",
                    dir.path().join("audit.log").display()
                ))
                // Written as it happens: a test reads the log right after the requests.
                .arg("--audit-log-mode=blocking")
                .arg("--profiling=false"),
            &dir.path().join("kube-apiserver.log"),
        );

        let ca = dir.path().join("ca.pem");
        std::fs::copy(pki.path("ca.pem"), &ca).unwrap_or_else(|e| panic!("copying the CA: {e}"));
        let url = format!("https://127.0.0.1:{port}");
        let mut plane = ControlPlane {
            dir,
            etcd,
            apiserver,
            etcd_port,
            url,
            admin: PathBuf::new(),
        };
        plane.admin = plane.kubeconfig(ADMIN, &token);
        plane.wait_ready(Duration::from_secs(120));
        plane
    }

    /// The kube-apiserver process's id: its CPU time is in `/proc/<pid>/stat`.
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.id()
    }

    /// The API server's URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin's kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin
    }

    /// The CA that signed the API server's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Writes a kubeconfig that authenticates as `user` with `token`; its path.
    pub fn kubeconfig(&self, user: &str, token: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{user}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: podstream-test\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\n\
             users:\n- name: {user}\n  user:\n    token: {token}\n\
             contexts:\n- name: {user}\n  context:\n    cluster: podstream-test\n    user: {user}\n\
             current-context: {user}\n",
            url = self.url,
            ca = self.ca().display(),
        );
        write(&path, &text);
        path
    }

    /// Creates a namespace named `<prefix>-<n>` (unique in this process) with its `default`
    /// service account; its name.
    pub fn namespace(&self, prefix: &str) -> String {
        let n = NAMESPACES.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        self.create_namespace(&name);
        name
    }

    /// Creates namespace `name` (or leaves it as it is) with its `default` service account, as
    /// the controller manager that does not run here would make it.
    pub fn create_namespace(&self, name: &str) {
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n  namespace: {name}\n"
        ));
    }

    /// `kubectl apply -f -` of `yaml` as the admin.
    ///
    /// # Panics
    /// When kubectl refuses it.
    pub fn apply(&self, yaml: &str) {
        let (ok, out, err) = self.kubectl_with_input(&["apply", "-f", "-"], yaml);
        assert!(ok, "kubectl apply failed: {err}\n{out}\n{yaml}");
    }

    /// Runs the built kubectl as the admin: (success, stdout, stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        crate::kubectl(&self.admin, args)
    }

    /// Runs the built kubectl as the admin with `input` on its stdin.
    ///
    /// # Panics
    /// When kubectl cannot be started.
    pub fn kubectl_with_input(&self, args: &[&str], input: &str) -> (bool, String, String) {
        kubectl_with_input(&self.admin, args, input)
    }

    /// A token for service account `namespace/name` (TokenRequest, one hour).
    ///
    /// # Panics
    /// When the API server refuses it.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let (ok, out, err) =
            self.kubectl(&["create", "token", name, "-n", namespace, "--duration=1h"]);
        assert!(ok, "TokenRequest for {namespace}/{name}: {err}");
        out.trim().to_owned()
    }

    /// A kubeconfig that authenticates as service account `namespace/name`.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> PathBuf {
        let token = self.service_account_token(namespace, name);
        self.kubeconfig(&format!("{namespace}-{name}"), &token)
    }

    /// Compacts etcd's history up to its current revision, as the API server's compactor does
    /// every few minutes: a watch from an older resourceVersion then gets `410 Gone`.
    ///
    /// # Panics
    /// When etcd does not answer.
    pub fn compact(&self) {
        let range = self.etcd_post("/v3/kv/range", r#"{"key":"AA==","limit":1}"#);
        let revision = range
            .pointer("/header/revision")
            .and_then(|r| r.as_str())
            .unwrap_or_else(|| panic!("etcd's revision in {range}"))
            .to_owned();
        self.etcd_post(
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        );
    }

    /// A POST to etcd's JSON gateway; the answer's body.
    fn etcd_post(&self, path: &str, body: &str) -> serde_json::Value {
        let mut stream = TcpStream::connect(("127.0.0.1", self.etcd_port))
            .unwrap_or_else(|e| panic!("connecting to etcd: {e}"));
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .unwrap_or_else(|e| panic!("writing to etcd: {e}"));
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .unwrap_or_else(|e| panic!("reading from etcd: {e}"));
        let (head, rest) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(head.contains(" 200 "), "etcd {path}: {answer}");
        let json = rest
            .find('{')
            .zip(rest.rfind('}'))
            .and_then(|(start, end)| rest.get(start..=end))
            .unwrap_or("{}");
        serde_json::from_str(json).unwrap_or_else(|e| panic!("etcd {path}: {e}: {answer}"))
    }

    /// Every request of a service account so far, from the audit log (a watch twice: as its
    /// answer starts and as it ends).
    pub fn audit(&self) -> Vec<Audited> {
        let log = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            // A watch is logged when its answer starts, and again when it ends.
            .filter(|event| {
                event["stage"] == "ResponseComplete" || event["stage"] == "ResponseStarted"
            })
            .map(|event| {
                let text = |pointer: &str| {
                    event
                        .pointer(pointer)
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                let subresource = text("/objectRef/subresource");
                let mut resource = text("/objectRef/resource");
                if !subresource.is_empty() {
                    resource = format!("{resource}/{subresource}");
                }
                Audited {
                    user: text("/user/username"),
                    verb: text("/verb"),
                    group: text("/objectRef/apiGroup"),
                    resource,
                    namespace: text("/objectRef/namespace"),
                    name: text("/objectRef/name"),
                    code: event
                        .pointer("/responseStatus/code")
                        .and_then(serde_json::Value::as_u64)
                        .and_then(|c| u16::try_from(c).ok())
                        .unwrap_or_default(),
                    at: time::OffsetDateTime::parse(
                        &text("/stageTimestamp"),
                        &time::format_description::well_known::Rfc3339,
                    )
                    .ok(),
                }
            })
            .collect()
    }

    /// The API server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let (ok, _, _) = self.kubectl(&["get", "--raw", "/readyz"]);
            if ok {
                return;
            }
            for (name, child) in [
                ("etcd", &mut self.etcd),
                ("kube-apiserver", &mut self.apiserver),
            ] {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "{name} exited ({status}) before the API server was ready:\n{}",
                        tail(&self.dir.path().join(format!("{name}.log")))
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "the API server was not ready within {within:?}:\n{}",
                tail(&self.dir.path().join("kube-apiserver.log"))
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs kubectl with `kubeconfig` and `input` on its stdin: (success, stdout, stderr).
///
/// # Panics
/// When kubectl cannot be started.
pub fn kubectl_with_input(kubeconfig: &Path, args: &[&str], input: &str) -> (bool, String, String) {
    let mut child = Command::new(tool("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run kubectl (scripts/setup.sh builds it): {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    let output = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Starts a server in a process group of its own, its output in `log`, ended with this
/// process however it ends.
fn spawn(command: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let child = std::os::unix::process::CommandExt::process_group(command, 0)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    crate::kill_when_this_process_ends(crate::Doomed::Group(child.id()));
    child
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// The last lines of a log, for a panic message.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

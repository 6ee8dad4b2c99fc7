//! `deploy/` on a real kube-apiserver (RBAC and admission on): the ingest under its own
//! Role with a ServiceAccount token, every verb the Role grants used and each one needed; the
//! second-deployment recipe under the Role it documents; the worker-pod admission policy; and
//! a server-side dry run of every overlay and component with the CRDs they use.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use podstream_proto::subject::{Stream, Subjects, stream_names};
use podstream_sim::WorkerPod;
use podstream_tests::control_plane::{ControlPlane, tool};
use podstream_tests::nats::NatsServer;
use podstream_tests::{bus, overlay_dir, podstream_binary, workspace_root};
use serde_json::Value;

/// Applies the podstream-executor overlay to `namespace`, as an operator would with their own
/// overlay naming their namespace, with `extra` lines (patches) in its kustomization.
fn apply_overlay(plane: &ControlPlane, namespace: &str, extra: &str) {
    let dir = overlay_dir("podstream-rbac-");
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "namespace: {namespace}\nresources:\n  - ../../deploy/overlays/podstream-executor\n{extra}"
        ),
    )
    .unwrap();
    let (ok, out, err) = plane.kubectl(&["apply", "-k", &dir.path().display().to_string()]);
    assert!(ok, "kubectl apply -k: {err}\n{out}");
}

/// `podstream ingest` as its ServiceAccount, its log in a file.
struct IngestProcess {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl IngestProcess {
    fn start(kubeconfig: &Path, namespace: &str, nats: &str, pod: &str, more: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("ingest.log");
        let child = Command::new(podstream_binary())
            .args(["ingest", "--nats", nats, "--namespaces", namespace])
            .args([
                "--lease-namespace",
                namespace,
                "--lease-duration-seconds",
                "4",
            ])
            .args(more)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", pod)
            .env("PODSTREAM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        podstream_stage::kill_when_this_process_ends(podstream_stage::Doomed::Process(child.id()));
        IngestProcess {
            child,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn terminate(&mut self) -> ExitStatus {
        nix_term(self.child.id());
        self.wait_exit(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("the ingest did not stop on SIGTERM:\n{}", self.log()))
    }
}

impl Drop for IngestProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn nix_term(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// Creates a worker pod in `namespace` as the admin.
fn create_worker_pod(plane: &ControlPlane, namespace: &str, name: &str) {
    let mut pod = WorkerPod::new(name, "1", "etl", "extract", "manual__1");
    pod.namespace = namespace.to_owned();
    let (ok, _, err) = plane.kubectl_with_input(&["create", "-f", "-"], &pod.to_json().to_string());
    assert!(ok, "creating {name}: {err}");
}

fn lease_holder(plane: &ControlPlane, namespace: &str, name: &str) -> Option<String> {
    let (ok, out, _) = plane.kubectl(&[
        "get",
        "lease",
        name,
        "-n",
        namespace,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    ok.then(|| out.trim().to_owned()).filter(|h| !h.is_empty())
}

/// Waits until `check` holds, at most `within`.
fn wait_for(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The Role's grants as (verb, group, resource), read back from the API server.
fn role_grants(plane: &ControlPlane, namespace: &str) -> BTreeSet<(String, String, String)> {
    let role = role(plane, namespace);
    let mut grants = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    grants.insert((
                        verb.as_str().unwrap().to_owned(),
                        group.as_str().unwrap().to_owned(),
                        resource.as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
    }
    grants
}

fn role(plane: &ControlPlane, namespace: &str) -> Value {
    let (ok, out, err) = plane.kubectl(&[
        "get",
        "role",
        "podstream-ingest",
        "-n",
        namespace,
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// Whether the ingest's ServiceAccount may `verb` `resource` (`kubectl auth can-i`).
fn can(plane: &ControlPlane, namespace: &str, verb: &str, resource: &str) -> bool {
    let user = format!("system:serviceaccount:{namespace}:podstream-ingest");
    let (_, out, _) = plane.kubectl(&[
        "auth", "can-i", verb, resource, "-n", namespace, "--as", &user,
    ]);
    out.trim() == "yes"
}

/// A nats-server and a JetStream client; a namespace of the shared control plane with the
/// podstream-executor overlay applied, and the ingest's ServiceAccount's kubeconfig.
struct Rig {
    nats: NatsServer,
    js: jetstream::Context,
    plane: &'static ControlPlane,
    namespace: String,
    kubeconfig: PathBuf,
}

impl Rig {
    async fn new(prefix: &str) -> Rig {
        let nats = NatsServer::start();
        let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let plane = tokio::task::spawn_blocking(ControlPlane::shared)
            .await
            .unwrap();
        let namespace = plane.namespace(prefix);
        apply_overlay(plane, &namespace, "");
        let kubeconfig = plane.service_account_kubeconfig(&namespace, "podstream-ingest");
        Rig {
            nats,
            js,
            plane,
            namespace,
            kubeconfig,
        }
    }
}

/// Waits until `stream` holds `n` messages.
async fn events_reach(js: &jetstream::Context, stream: &str, n: u64) {
    bus::settle(js, stream, n, Duration::ZERO, Duration::from_secs(60)).await;
}

/// The ingest runs under deploy/'s Role with a ServiceAccount token: it leads, publishes, and
/// after a kill -9 its pod's next container takes the Lease back. The audit log of the whole
/// run shows it used every verb its Role grants, and was refused none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingest_works_under_its_role_and_uses_every_verb_it_grants() {
    let Rig {
        nats,
        js,
        plane,
        namespace,
        kubeconfig,
    } = Rig::new("rbac").await;

    let mut ingest = IngestProcess::start(&kubeconfig, &namespace, &nats.url(), "ingest-0", &[]);
    create_worker_pod(plane, &namespace, "first");
    events_reach(&js, stream_names::PODS, 1).await;
    let first = lease_holder(plane, &namespace, "podstream-ingest").expect("a holder");
    assert!(first.starts_with("ingest-0_"), "{first}");

    // Its pod's next container (same POD_NAME) takes the Lease back at once: `update`.
    ingest.kill();
    let mut ingest = IngestProcess::start(&kubeconfig, &namespace, &nats.url(), "ingest-0", &[]);
    create_worker_pod(plane, &namespace, "second");
    events_reach(&js, stream_names::PODS, 2).await;
    let second = lease_holder(plane, &namespace, "podstream-ingest").expect("a holder");
    assert_ne!(first, second, "the new container holds the Lease");
    assert!(ingest.terminate().success(), "{}", ingest.log());

    let user = format!("system:serviceaccount:{namespace}:podstream-ingest");
    let requests: Vec<_> = plane
        .audit()
        .into_iter()
        .filter(|r| r.user == user)
        .collect();
    let refused: Vec<_> = requests.iter().filter(|r| r.code == 403).collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");
    let used: BTreeSet<(String, String, String)> = requests
        .iter()
        .filter(|r| r.group != "authorization.k8s.io")
        .map(|r| (r.verb.clone(), r.group.clone(), r.resource.clone()))
        .collect();
    assert_eq!(
        used,
        role_grants(plane, &namespace),
        "the ingest used exactly what its Role grants"
    );
}

/// Without any one verb its Role grants, the ingest stops at start (exit 78) naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_any_one_verb_of_its_role_the_ingest_stops_naming_it() {
    let Rig {
        nats,
        js: _js,
        plane,
        namespace,
        kubeconfig,
    } = Rig::new("least").await;
    let mut full = role(plane, &namespace);
    // Replaced whole each time: no revision to match.
    if let Some(meta) = full["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    let rules = full["rules"].as_array().unwrap().clone();
    let mut tried = 0;
    for (index, rule) in rules.iter().enumerate() {
        let resource = rule["resources"][0].as_str().unwrap().to_owned();
        let group = rule["apiGroups"][0].as_str().unwrap().to_owned();
        let named = rule["resourceNames"][0].as_str().map(str::to_owned);
        for verb in rule["verbs"].as_array().unwrap() {
            let verb = verb.as_str().unwrap();
            let mut less = full.clone();
            let verbs = less["rules"][index]["verbs"].as_array_mut().unwrap();
            verbs.retain(|v| v != verb);
            if verbs.is_empty() {
                less["rules"].as_array_mut().unwrap().remove(index);
            }
            let (ok, _, err) = plane.kubectl_with_input(&["replace", "-f", "-"], &less.to_string());
            assert!(ok, "{err}");
            let group_part = if group.is_empty() {
                String::new()
            } else {
                format!(".{group}")
            };
            let qualified = match &named {
                Some(name) => format!("{resource}{group_part}/{name}"),
                None => format!("{resource}{group_part}"),
            };
            wait_for(
                Duration::from_secs(10),
                "the Role's change to apply",
                || !can(plane, &namespace, verb, &qualified),
            );

            let mut ingest =
                IngestProcess::start(&kubeconfig, &namespace, &nats.url(), "ingest-0", &[]);
            let status = ingest.wait_exit(Duration::from_secs(30));
            let log = ingest.log();
            assert_eq!(
                status.and_then(|s| s.code()),
                Some(78),
                "without {verb} {qualified} the ingest must stop:\n{log}"
            );
            let named_part = named
                .as_ref()
                .map(|n| format!(" {n:?}"))
                .unwrap_or_default();
            let wanted = format!(
                "may not {verb} {resource}{group_part}{named_part} in namespace {namespace}"
            );
            assert!(log.contains(&wanted), "{wanted:?} not in:\n{log}");
            tried += 1;
        }
    }
    assert_eq!(
        tried, 6,
        "list and watch pods; create, get, patch, update leases"
    );
    let (ok, _, err) = plane.kubectl_with_input(&["replace", "-f", "-"], &full.to_string());
    assert!(ok, "{err}");
}

/// docs/operations.md's second deployment: its own `--prefix` names its own Lease, which the
/// shipped Role does not allow until the documented patch names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_deployment_under_its_own_prefix_works_under_the_role_it_documents() {
    let Rig {
        nats,
        js,
        plane,
        namespace,
        kubeconfig,
    } = Rig::new("second").await;
    let prefix = [
        "--prefix",
        "airflow-b",
        "--pod-selector",
        "release=airflow-b",
    ];

    let mut refused = IngestProcess::start(&kubeconfig, &namespace, &nats.url(), "b-0", &prefix);
    let status = refused.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|s| s.code()), Some(78), "{}", refused.log());
    assert!(
        refused.log().contains("\"airflow-b-ingest\""),
        "{}",
        refused.log()
    );

    let recipe = documented_lease_patch();
    apply_overlay(plane, &namespace, &recipe);
    wait_for(Duration::from_secs(10), "the patched Role to apply", || {
        can(
            plane,
            &namespace,
            "get",
            "leases.coordination.k8s.io/airflow-b-ingest",
        )
    });
    leads_as_airflow_b(plane, &js, &namespace, &kubeconfig, &nats.url()).await;
}

/// The kustomize patch docs/operations.md gives for a second deployment's Role, with its
/// prefix `airflow-b`.
fn documented_lease_patch() -> String {
    let page = std::fs::read_to_string(workspace_root().join("docs/operations.md")).unwrap();
    let start = page
        .find("```yaml\npatches:\n  - target:\n      kind: Role")
        .expect("docs/operations.md gives the Role patch");
    let block = &page[start + "```yaml\n".len()..];
    let block = &block[..block.find("```").unwrap()];
    block.replace("<prefix>", "airflow-b")
}

/// deploy/admission as shipped, for `namespace` and its scheduler account: the three places
/// the shipped files name `airflow`.
fn admission_for(plane: &ControlPlane, namespace: &str) -> String {
    let (ok, yaml, err) = plane.kubectl(&[
        "kustomize",
        &workspace_root()
            .join("deploy/admission")
            .display()
            .to_string(),
    ]);
    assert!(ok, "{err}");
    let mut yaml = yaml;
    for (from, to) in [
        (
            "system:serviceaccount:airflow:airflow-scheduler",
            format!("system:serviceaccount:{namespace}:airflow-scheduler"),
        ),
        (
            "kubernetes.io/metadata.name: airflow\n",
            format!("kubernetes.io/metadata.name: {namespace}\n"),
        ),
        ("namespace: airflow\n", format!("namespace: {namespace}\n")),
    ] {
        assert!(
            yaml.contains(from),
            "deploy/admission no longer says {from:?}"
        );
        yaml = yaml.replace(from, &to);
    }
    yaml
}

/// Runs kubectl as `user` (impersonated by the admin): (success, stderr).
fn as_user(plane: &ControlPlane, user: &str, args: &[&str], input: &str) -> (bool, String) {
    let mut all = vec!["--as", user];
    all.extend_from_slice(args);
    let (ok, _, err) = plane.kubectl_with_input(&all, input);
    (ok, err)
}

/// deploy/admission's policy: only the schedulers' ServiceAccount creates worker pods or
/// changes what podstream reads of them; anyone else is refused with the policy's message,
/// and everything else (other pods, other labels, status writes) passes.
#[test]
fn only_the_schedulers_account_creates_worker_pods_or_changes_their_keys() {
    let plane = ControlPlane::shared();
    let namespace = plane.namespace("admission");
    let scheduler = format!("system:serviceaccount:{namespace}:airflow-scheduler");
    let author = format!("system:serviceaccount:{namespace}:dag-author");
    plane.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: pods\n  namespace: {namespace}\n\
         rules:\n  - apiGroups: [\"\"]\n    resources: [pods]\n    verbs: [create, get, list, update, patch, delete]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: pods\n  namespace: {namespace}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pods}}\n\
         subjects:\n  - {{kind: ServiceAccount, name: airflow-scheduler, namespace: {namespace}}}\n  - {{kind: ServiceAccount, name: dag-author, namespace: {namespace}}}\n"
    ));
    plane.apply(&admission_for(plane, &namespace));

    let mut forged = WorkerPod::new("forged", "1", "etl", "extract", "manual__1");
    forged.namespace.clone_from(&namespace);
    let forged = forged.to_json().to_string();
    let refusal = "only the Airflow schedulers";
    // The API server takes a new policy up within a moment.
    wait_for(
        Duration::from_secs(20),
        "the policy to refuse a forged worker pod",
        || {
            let (ok, err) = as_user(plane, &author, &["create", "-f", "-"], &forged);
            if ok {
                let _ = plane.kubectl(&[
                    "delete",
                    "pod",
                    "forged",
                    "-n",
                    &namespace,
                    "--grace-period=0",
                ]);
            }
            !ok && err.contains(refusal)
        },
    );
    let (ok, err) = as_user(plane, &author, &["create", "-f", "-"], &forged);
    assert!(
        !ok && err.contains(&format!("{refusal} ({scheduler}) may create")),
        "{err}"
    );
    assert!(err.contains(&format!("{author} may not")), "{err}");

    let mut real = WorkerPod::new("real", "1", "etl", "extract", "manual__1");
    real.namespace.clone_from(&namespace);
    let (ok, err) = as_user(
        plane,
        &scheduler,
        &["create", "-f", "-"],
        &real.to_json().to_string(),
    );
    assert!(ok, "the scheduler creates its worker pod: {err}");
    let plain = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"plain\",\"namespace\":\"{namespace}\"}},\
         \"spec\":{{\"containers\":[{{\"name\":\"c\",\"image\":\"busybox\"}}]}}}}"
    );
    let (ok, err) = as_user(plane, &author, &["create", "-f", "-"], &plain);
    assert!(ok, "a pod that is no worker pod is not the policy's: {err}");

    let ns = ["-n", namespace.as_str()];
    let table: [(&str, &[&str], bool); 8] = [
        (
            &author,
            &["label", "pod", "real", "airflow-worker=2", "--overwrite"],
            false,
        ),
        (&author, &["label", "pod", "real", "airflow-worker-"], false),
        (
            &author,
            &["label", "pod", "real", "airflow_executor_done=True"],
            false,
        ),
        (
            &author,
            &["annotate", "pod", "real", "try_number=2", "--overwrite"],
            false,
        ),
        (
            &author,
            &[
                "annotate",
                "pod",
                "real",
                "task_instance_id=0198a0b2-1c3d-7e4f-8a9b-0c1d2e3f4a5b",
            ],
            false,
        ),
        (
            &author,
            &["label", "pod", "plain", "airflow-worker=1"],
            false,
        ),
        (&author, &["label", "pod", "real", "team=data"], true),
        (
            &scheduler,
            &["label", "pod", "real", "airflow-worker=2", "--overwrite"],
            true,
        ),
    ];
    for (user, change, allowed) in table {
        let mut args: Vec<&str> = change.to_vec();
        args.extend_from_slice(&ns);
        let (ok, err) = as_user(plane, user, &args, "");
        assert_eq!(ok, allowed, "{user} {change:?}: {err}");
        if !allowed {
            assert!(err.contains(refusal), "{user} {change:?}: {err}");
        }
    }
    // A kubelet's status write is not the policy's.
    let (ok, _, err) = plane.kubectl(&[
        "patch",
        "pod",
        "real",
        "-n",
        &namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ]);
    assert!(ok, "{err}");
}

/// Every overlay and component of deploy/ is accepted by the API server in a server-side dry
/// run, with the CRDs it uses (prometheus-operator's, from its Go module).
#[test]
fn every_overlay_and_component_passes_a_server_side_dry_run() {
    let plane = ControlPlane::shared();
    plane.create_namespace("airflow");
    install_monitoring_crds(plane);

    let with_monitoring = overlay_dir("podstream-dry-run-");
    std::fs::write(
        with_monitoring.path().join("kustomization.yaml"),
        "resources:\n  - ../../deploy/overlays/podstream-executor\ncomponents:\n  - ../../deploy/monitoring\n  - ../../deploy/collector\n",
    )
    .unwrap();
    let root = workspace_root();
    let targets: Vec<PathBuf> = vec![
        root.join("deploy/overlays/podstream-executor"),
        root.join("deploy/overlays/stock-executor"),
        with_monitoring.path().to_path_buf(),
        root.join("deploy/admission"),
    ];
    for target in targets {
        let target = target.display().to_string();
        let (ok, out, err) = plane.kubectl(&[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "--field-manager=podstream-test",
            "-k",
            &target,
        ]);
        assert!(ok, "{target}: {err}\n{out}");
        assert!(out.contains("(server dry run)"), "{target}: {out}");
    }
}

/// prometheus-operator's PodMonitor and PrometheusRule CRDs (from its Go module, by
/// scripts/kubernetes-tools.sh), established on `plane`.
fn install_monitoring_crds(plane: &ControlPlane) {
    let crds = tool("kubectl")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("crds");
    for crd in [
        "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ] {
        let path = crds.join(crd).display().to_string();
        let (ok, _, err) = plane.kubectl(&["apply", "--server-side", "-f", &path]);
        assert!(ok, "{crd}: {err}");
    }
    let (ok, _, err) = plane.kubectl(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/podmonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]);
    assert!(ok, "{err}");
}

/// deploy/chart installed with Helm as a second deployment (`prefix=airflow-b`, its own
/// release, monitoring and the collector on): the ingest under the chart's ServiceAccount
/// leads through the Lease the chart's Role names, with no patch, and publishes its
/// selector's worker pod on the prefix's stream; `podstream check ingest` finds every permission for that prefix and
/// none for another Lease; `podstream check collect` finds the collector's delete in the
/// release's namespace only; `helm uninstall` takes every object of the release away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_its_ingest_leads_under_the_role_it_makes() {
    let nats = NatsServer::start();
    let js = jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let plane = tokio::task::spawn_blocking(ControlPlane::shared)
        .await
        .unwrap();
    install_monitoring_crds(plane);
    let namespace = plane.namespace("chart");
    let helm = |args: &[&str]| {
        let output = Command::new(tool("helm"))
            .args(args)
            .args(["--namespace", &namespace, "--kubeconfig"])
            .arg(plane.admin_kubeconfig())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let chart = workspace_root().join("deploy/chart").display().to_string();
    helm(&[
        "install",
        "airflow-b",
        &chart,
        "--set",
        "prefix=airflow-b",
        "--set",
        "podSelector=release=airflow-b",
        "--set",
        "monitoring.podMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "collector.enabled=true",
    ]);
    let listed = helm(&["list", "--output", "json"]);
    assert!(listed.contains("\"status\":\"deployed\""), "{listed}");

    let kubeconfig = plane.service_account_kubeconfig(&namespace, "airflow-b-podstream-ingest");
    // `podstream check <args>` as the account of `account_kubeconfig`: its exit code and report.
    let check_as = |account_kubeconfig: &Path, args: &[&str]| {
        let output = Command::new(podstream_binary())
            .arg("check")
            .args(args)
            .args(["--nats", &nats.url()])
            .env("KUBECONFIG", account_kubeconfig)
            .env_remove("PODSTREAM_STREAM_REPLICAS")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    // `podstream check ingest` under that account: every permission granted for the chart's
    // prefix; under another prefix, the Lease's three verbs fail (exit 78).
    let check = |prefix: &str| {
        check_as(
            &kubeconfig,
            &[
                "ingest",
                "--prefix",
                prefix,
                "--namespaces",
                &namespace,
                "--lease-namespace",
                &namespace,
            ],
        )
    };
    let (code, report) = check("airflow-b");
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains("ok    kubernetes: update leases.coordination.k8s.io \"airflow-b-ingest\""),
        "{report}"
    );
    let (code, report) = check("airflow-c");
    assert_eq!(code, Some(78), "{report}");
    let failed: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failed.len(), 3, "{report}");
    assert!(
        failed.iter().all(|l| l.contains("\"airflow-c-ingest\"")),
        "{report}"
    );

    // `podstream check collect` under the collector's account: delete granted in the
    // release's namespace; patch (labelling pods done) and any other namespace are not.
    let collector = plane.service_account_kubeconfig(&namespace, "airflow-b-podstream-collect");
    let check_collect = |more: &[&str]| {
        let args: Vec<&str> = ["collect", "--prefix", "airflow-b"]
            .into_iter()
            .chain(more.iter().copied())
            .collect();
        check_as(&collector, &args)
    };
    let (code, report) = check_collect(&["--namespaces", &namespace]);
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains(&format!(
            "ok    kubernetes: delete pods in namespace {namespace}"
        )),
        "{report}"
    );
    let (code, report) = check_collect(&[
        "--namespaces",
        &format!("{namespace},elsewhere"),
        "--delete-worker-pods",
        "false",
    ]);
    assert_eq!(code, Some(78), "{report}");
    let failed: Vec<&str> = report.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(
        failed.len(),
        3,
        "patch here, delete and patch elsewhere: {report}"
    );

    leads_as_airflow_b(plane, &js, &namespace, &kubeconfig, &nats.url()).await;

    helm(&["uninstall", "airflow-b", "--wait"]);
    let (ok, left, err) = plane.kubectl(&[
        "get",
        "deployments,configmaps,serviceaccounts,roles,rolebindings,networkpolicies,poddisruptionbudgets,podmonitors,prometheusrules",
        "-n",
        &namespace,
        "-l",
        "app.kubernetes.io/instance=airflow-b",
        "-o",
        "name",
    ]);
    assert!(ok, "{err}");
    assert!(left.trim().is_empty(), "left after uninstall: {left}");
}

/// The second deployment's ingest (`--prefix airflow-b --pod-selector release=airflow-b`)
/// under `kubeconfig`: it publishes a worker pod of its selector on the prefix's stream, holds
/// the Lease `airflow-b-ingest`, and stops cleanly.
async fn leads_as_airflow_b(
    plane: &ControlPlane,
    js: &jetstream::Context,
    namespace: &str,
    kubeconfig: &Path,
    nats: &str,
) {
    let prefix = [
        "--prefix",
        "airflow-b",
        "--pod-selector",
        "release=airflow-b",
    ];
    let mut ingest = IngestProcess::start(kubeconfig, namespace, nats, "b-0", &prefix);
    let mut pod = WorkerPod::new("b-pod", "1", "etl", "extract", "manual__1");
    pod.namespace = namespace.to_owned();
    let mut json = pod.to_json();
    json["metadata"]["labels"]["release"] = "airflow-b".into();
    let (ok, _, err) = plane.kubectl_with_input(&["create", "-f", "-"], &json.to_string());
    assert!(ok, "{err}");
    let stream = Subjects::new("airflow-b")
        .unwrap()
        .stream_name(Stream::PodEvents);
    bus::settle(js, &stream, 1, Duration::ZERO, Duration::from_secs(60)).await;
    assert!(
        lease_holder(plane, namespace, "airflow-b-ingest").is_some_and(|h| h.starts_with("b-0_")),
        "{}",
        ingest.log()
    );
    assert!(ingest.terminate().success(), "{}", ingest.log());
}

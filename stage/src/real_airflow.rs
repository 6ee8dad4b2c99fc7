//! A real Airflow on the simulator: PostgreSQL restored from the cached `airflow db migrate`
//! dump, `podstream sim --kubelet` (worker pods run as local processes from the Airflow venv),
//! and Airflow's own components with the stock `KubernetesExecutor`: the scheduler for 2.x;
//! the api-server (whose execution API the 3.x workers call), dag-processor and scheduler
//! for 3.x. The DAGs are under `stage/airflow/dags`; callbacks leave marker files.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::airflow::Airflow;
use crate::postgres::PgCluster;
use crate::{free_port, kubectl, podstream_binary, workspace_root};

/// The database Airflow runs on.
const DATABASE: &str = "airflow";
/// The key the stage's schedulers sign worker pods with (a test key, in the stage's dir).
const SIGNING_KEY: &str = "podstream-stage-pod-signing-key-0123456789abcdef\n";

/// The signing of the stage's schedulers: what a pod the stage makes in a scheduler's place
/// carries.
pub fn pod_signing() -> podstream_proto::signature::PodSigning {
    podstream_proto::signature::PodSigning::new([SIGNING_KEY])
        .unwrap_or_else(|e| panic!("the stage's signing key: {e}"))
}
/// Its file's name in the stage's dir.
const SIGNING_KEY_FILE: &str = "pod-signing-key";

/// Which DAGs the Airflow parses (a folder under `stage/airflow/dags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dags {
    /// `podstream_checks`: a success, a failure with a retry, a long task.
    Checks,
    /// `podstream_story`: one long task, for the seed stories.
    Story,
    /// `podstream_failures`: a task whose pod is killed (OOMKilled) while it runs, one retry.
    Failures,
    /// `podstream_launch_failures`: a task whose pods never start (image pull), one retry.
    LaunchFailures,
    /// `podstream_load`: `$PODSTREAM_LOAD_TASKS` tasks whose pods sleep
    /// `$PODSTREAM_LOAD_POD_SECONDS`, then fail without running the task (one retry, an hour
    /// later), for the scheduler-load benchmark.
    Load,
}

impl Dags {
    fn folder(self) -> PathBuf {
        let name = match self {
            Dags::Checks => "checks",
            Dags::Story => "story",
            Dags::Failures => "failures",
            Dags::LaunchFailures => "launch_failures",
            Dags::Load => "load",
        };
        workspace_root().join("stage/airflow/dags").join(name)
    }
}

/// Which executor the schedulers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Executor {
    /// The provider's `KubernetesExecutor`, watching its pods by label.
    Stock,
    /// `podstream_airflow.PodstreamKubernetesExecutor` (as `podstream_story_executor` in
    /// `stage/airflow/lib` extends it with story (h)'s hold), with `podstream run
    /// --task-failures executor` on a nats-server of its own.
    Podstream,
    /// The provider's `KubernetesExecutor`, with `podstream run --task-failures sink` beside
    /// it on a nats-server of its own: podstream's sink fails a running TI whose pod failed
    /// (the stock-executor overlay).
    Sink,
    /// The caller's: the stage starts no NATS and no podstream, and Airflow runs with the
    /// settings the caller adds ([`RealAirflow::set_up_with`]), as an install gives them.
    Installed,
}

/// Which Kubernetes the stage runs Airflow on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kubernetes {
    /// `podstream sim --kubelet`.
    Simulated,
    /// `podstream sim --kubelet --kubelet-max-pods 1`: one pod runs at a time, the others
    /// wait Pending (unschedulable) until it ends.
    SimulatedOnePodAtATime,
    /// A control plane of its own (kube-apiserver and etcd, [`crate::control_plane`]) with
    /// `podstream kubelet` as its node.
    Real,
    /// [`Kubernetes::Real`] with a node that runs one pod at a time (`--max-pods 1`).
    RealOnePodAtATime,
}

/// One task instance as the metadata DB holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiRow {
    /// `task_id`.
    pub task_id: String,
    /// `state` ("" for none).
    pub state: String,
    /// `try_number`.
    pub try_number: i64,
}

/// A process started in its own process group, stopped with the group.
struct Service {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Service {
    fn spawn(name: &str, mut command: Command, log: PathBuf) -> Service {
        let file = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let err = file.try_clone().unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::process::CommandExt;
        let child = command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        crate::kill_when_this_process_ends(crate::Doomed::Group(child.id()));
        Service {
            name: name.to_owned(),
            child,
            log,
        }
    }

    fn group(&self) -> Option<Pid> {
        i32::try_from(self.child.id()).ok().map(Pid::from_raw)
    }

    /// Its own process group and those of every process descended from it: all that a
    /// container running it would hold. Airflow 2's scheduler starts its DAG file processor
    /// manager in a group of its own, and that manager keeps copies of the scheduler's
    /// database sockets: a scheduler killed with only its own group leaves the manager
    /// running, and with it the killed scheduler's open transaction and its row locks.
    fn groups(&self) -> BTreeSet<Pid> {
        let mut groups: BTreeSet<Pid> = self.group().into_iter().collect();
        groups.extend(descendant_groups(self.child.id()));
        groups
    }

    /// Sends `signal` to every process the component has, as when its container is
    /// signalled; after SIGKILL, waits until none of them is left.
    fn signal(&self, signal: Signal) {
        let groups = self.groups();
        for group in &groups {
            let _ = killpg(*group, signal);
        }
        if signal == Signal::SIGKILL {
            let deadline = Instant::now() + Duration::from_secs(10);
            while any_alive_in(&groups) {
                assert!(
                    Instant::now() < deadline,
                    "{}: processes of groups {groups:?} outlived SIGKILL",
                    self.name
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// SIGTERM to its own group (Airflow stops its children itself), up to 15 s to exit,
    /// then SIGKILL to whatever of it is left.
    fn stop(&mut self) {
        let groups = self.groups();
        if let Some(group) = self.group() {
            let _ = killpg(group, Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for group in groups.union(&self.groups()) {
            let _ = killpg(*group, Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// The last lines of its log.
    fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        let from = all.len().saturating_sub(lines);
        format!(
            "--- {} ({}):\n{}",
            self.name,
            self.log.display(),
            all[from..].join("\n")
        )
    }
}

/// What happened, in order: pod changes (a kubectl watch), task instance, scheduler job and
/// callback changes (sampled whenever the test waits), and the test's own actions.
struct Recorder {
    start: Instant,
    entries: Arc<Mutex<Vec<(Duration, String)>>>,
    rows: Mutex<BTreeMap<String, String>>,
    markers: Mutex<BTreeSet<String>>,
    watch: Option<Child>,
}

impl Recorder {
    fn start(kubeconfig: &Path) -> Recorder {
        let start = Instant::now();
        let entries: Arc<Mutex<Vec<(Duration, String)>>> = Arc::default();
        let watch = Command::new(crate::control_plane::tool("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "get",
                "pods",
                "-A",
                "-w",
                "--output-watch-events",
                "-o",
                "json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        let mut watch = watch;
        if let Some(stdout) = watch.as_mut().and_then(|w| w.stdout.take()) {
            let entries = entries.clone();
            std::thread::spawn(move || {
                let mut last: BTreeMap<String, String> = BTreeMap::new();
                let events = serde_json::Deserializer::from_reader(stdout).into_iter::<Value>();
                for event in events.map_while(Result::ok) {
                    let pod = &event["object"];
                    let name = pod["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let summary = pod_summary(&event);
                    if last.get(&name) != Some(&summary) {
                        entries
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push((start.elapsed(), format!("pod {name}: {summary}")));
                        last.insert(name, summary);
                    }
                }
            });
        }
        Recorder {
            start,
            entries,
            rows: Mutex::default(),
            markers: Mutex::default(),
            watch,
        }
    }

    fn push(&self, what: String) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((self.start.elapsed(), what));
    }

    /// Records each keyed row whose text changed since the last sample.
    fn rows(&self, rows: impl IntoIterator<Item = (String, String)>) {
        let mut last = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, text) in rows {
            if last.get(&key) != Some(&text) {
                self.push(text.clone());
                last.insert(key, text);
            }
        }
    }

    fn render(&self) -> String {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        entries.sort_by_key(|(at, _)| *at);
        entries
            .iter()
            .map(|(at, what)| format!("{:>6.1}s  {what}", at.as_secs_f64()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.as_mut() {
            let _ = watch.kill();
            let _ = watch.wait();
        }
    }
}

/// A pod event in a few words: type, phase, owner, terminating.
fn pod_summary(event: &Value) -> String {
    let pod = &event["object"];
    let phase = pod["status"]["phase"].as_str().unwrap_or("-");
    let owner = pod["metadata"]["labels"]["airflow-worker"]
        .as_str()
        .unwrap_or("-");
    let mut summary = format!(
        "{} {phase}, airflow-worker={owner}",
        event["type"].as_str().unwrap_or_default()
    );
    if pod["metadata"]["deletionTimestamp"].is_string() {
        summary.push_str(", terminating");
    }
    for label in ["airflow_executor_done", "airflow_pod_revoked"] {
        if pod["metadata"]["labels"][label].is_string() {
            summary.push_str(&format!(", {label}"));
        }
    }
    summary
}

/// Seconds `podstream run` leaves a losing duplicate or a stale pod before deleting it.
pub const COLLECT_GRACE_SECONDS: u64 = 5;

/// Who deletes pods on the stage's real control plane: each a service account of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Deleter {
    /// Airflow's schedulers (their executor).
    Scheduler,
    /// `podstream run` (its collector).
    Podstream,
    /// The kubelet, confirming a graceful delete once the pod's processes ended.
    Kubelet,
}

impl Deleter {
    /// Every one.
    pub const ALL: [Deleter; 3] = [Deleter::Scheduler, Deleter::Podstream, Deleter::Kubelet];

    /// Its service account in namespace `airflow`.
    pub fn account(self) -> &'static str {
        match self {
            Deleter::Scheduler => "airflow-scheduler",
            Deleter::Podstream => "podstream",
            Deleter::Kubelet => "podstream-kubelet",
        }
    }
}

/// A real Airflow on `podstream sim --kubelet`, with the stock executor or podstream's.
pub struct RealAirflow {
    /// Which release.
    pub airflow: Airflow,
    /// Which executor its schedulers run.
    pub executor: Executor,
    /// The simulator's kubeconfig (on a real control plane, its admin's).
    pub kubeconfig: PathBuf,
    /// The kubeconfig `podstream run` uses: the stage's, or on a real control plane a
    /// service account of its own, so the audit log tells its requests apart.
    podstream_kubeconfig: PathBuf,
    /// Where callbacks leave their markers.
    pub markers: PathBuf,
    /// Where a story says how a try of the story task ends (a file named after the try).
    pub endings: PathBuf,
    pg: PgCluster,
    env: Vec<(String, String)>,
    sim: Option<Service>,
    control_plane: Option<crate::control_plane::ControlPlane>,
    nats: Option<crate::nats::NatsServer>,
    podstream: Option<Service>,
    components: Vec<Service>,
    recorder: Option<Recorder>,
    dir: tempfile::TempDir,
}

impl RealAirflow {
    /// Starts PostgreSQL, the simulator with its kubelet, and Airflow's components.
    ///
    /// # Panics
    /// When anything fails to start: the test cannot go on without it.
    pub fn start(airflow: Airflow, dags: Dags) -> RealAirflow {
        RealAirflow::start_with(airflow, dags, Executor::Stock)
    }

    /// Starts PostgreSQL, the simulator with its kubelet, for [`Executor::Podstream`] a
    /// nats-server and `podstream run`, and Airflow's components with `executor`.
    ///
    /// # Panics
    /// When anything fails to start: the test cannot go on without it.
    pub fn start_with(airflow: Airflow, dags: Dags, executor: Executor) -> RealAirflow {
        RealAirflow::start_on(airflow, dags, executor, Kubernetes::Simulated)
    }

    /// [`RealAirflow::start_with`] on the Kubernetes given.
    ///
    /// # Panics
    /// When anything fails to start: the test cannot go on without it.
    pub fn start_on(
        airflow: Airflow,
        dags: Dags,
        executor: Executor,
        kubernetes: Kubernetes,
    ) -> RealAirflow {
        let mut real = RealAirflow::set_up_on(airflow, dags, executor, kubernetes);
        real.start_components();
        real
    }

    /// Everything [`RealAirflow::start_on`] starts but Airflow's own components, which
    /// [`RealAirflow::start_components`] starts: a story can set the database up first.
    ///
    /// # Panics
    /// When anything fails to start: the test cannot go on without it.
    pub fn set_up_on(
        airflow: Airflow,
        dags: Dags,
        executor: Executor,
        kubernetes: Kubernetes,
    ) -> RealAirflow {
        RealAirflow::set_up_with(airflow, dags, executor, kubernetes, Vec::new())
    }

    /// [`RealAirflow::set_up_on`] with `settings` added to the environment of Airflow's
    /// components and its worker pods (`AIRFLOW__…` variables, after the stage's own).
    ///
    /// # Panics
    /// When anything fails to start: the test cannot go on without it.
    pub fn set_up_with(
        airflow: Airflow,
        dags: Dags,
        executor: Executor,
        kubernetes: Kubernetes,
        settings: Vec<(String, String)>,
    ) -> RealAirflow {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let pg = PgCluster::start_with_password();
        pg.create_database(DATABASE, Some(&airflow.cached_pg_dump()));
        let kubeconfig = dir.path().join("kubeconfig");
        let markers = dir.path().join("markers");
        let endings = dir.path().join("endings");
        let home = dir.path().join("airflow-home");
        for folder in [&markers, &endings, &home] {
            std::fs::create_dir_all(folder).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut env = environment(airflow, dags, &pg, &kubeconfig, &markers, &home);
        env.push((
            "PODSTREAM_ENDINGS".to_owned(),
            endings.display().to_string(),
        ));
        // The stories' podstream executor holds its loop once asked to in the same folder (a
        // story's kill between taking a fail and committing it): stage/airflow/lib.
        env.push((
            "PODSTREAM_TEST_HOLD_AFTER_TAKING".to_owned(),
            endings.display().to_string(),
        ));
        for (key, value) in settings {
            env.retain(|(name, _)| *name != key);
            env.push((key, value));
        }
        let nats = matches!(executor, Executor::Podstream | Executor::Sink)
            .then(crate::nats::NatsServer::start_with_token);
        if let (Some(nats), Executor::Podstream) = (&nats, executor) {
            env.retain(|(key, _)| key != "AIRFLOW__CORE__EXECUTOR");
            env.push((
                "AIRFLOW__CORE__EXECUTOR".to_owned(),
                "podstream_story_executor.StoryPodstreamKubernetesExecutor".to_owned(),
            ));
            env.push(("AIRFLOW__PODSTREAM__URL".to_owned(), nats.url()));
            if let Some(token) = nats.token_file() {
                env.push((
                    "AIRFLOW__PODSTREAM__TOKEN_FILE".to_owned(),
                    token.display().to_string(),
                ));
            }
            // As the podstream-executor overlay runs it: every pod signed, only signed pods act.
            let key = dir.path().join(SIGNING_KEY_FILE);
            std::fs::write(&key, SIGNING_KEY).unwrap_or_else(|e| panic!("{}: {e}", key.display()));
            env.push((
                "AIRFLOW__PODSTREAM__SIGNING_KEY_FILE".to_owned(),
                key.display().to_string(),
            ));
            // `podstream run --collect-pods` deletes the pods: the executor deletes none.
            env.push((
                "AIRFLOW__PODSTREAM__COLLECT_PODS".to_owned(),
                "True".to_owned(),
            ));
        }
        let mut real = RealAirflow {
            airflow,
            executor,
            podstream_kubeconfig: kubeconfig.clone(),
            kubeconfig,
            markers,
            endings,
            pg,
            env,
            sim: None,
            control_plane: None,
            nats,
            podstream: None,
            components: Vec::new(),
            recorder: None,
            dir,
        };
        match kubernetes {
            Kubernetes::Simulated => real.start_sim(None),
            Kubernetes::SimulatedOnePodAtATime => real.start_sim(Some(1)),
            Kubernetes::Real => real.start_control_plane(None),
            Kubernetes::RealOnePodAtATime => real.start_control_plane(Some(1)),
        }
        real.start_podstream();
        real.recorder = Some(Recorder::start(&real.kubeconfig));
        real
    }

    /// Starts Airflow's components (schedulers, DAG processor, API server) for its line.
    pub fn start_components(&mut self) {
        for component in self.airflow.components() {
            self.start_component(component);
        }
    }

    /// `default_pool`'s slots now.
    ///
    /// # Panics
    /// When the database has no `default_pool` (Airflow's migrations make it).
    pub fn default_pool_slots(&self) -> u32 {
        self.query("SELECT slots FROM slot_pool WHERE pool = 'default_pool'")
            .into_iter()
            .flatten()
            .find_map(|slots| slots.parse().ok())
            .unwrap_or_else(|| panic!("no default_pool in Airflow's database"))
    }

    /// Sets `default_pool`'s slots: at 0 a scheduler queues no task (it stays `scheduled`),
    /// so a story can act before any task's pod exists, however loaded the machine.
    pub fn set_default_pool_slots(&self, slots: u32) {
        self.query(&format!(
            "UPDATE slot_pool SET slots = {slots} WHERE pool = 'default_pool'"
        ));
        self.note(format!("default_pool set to {slots} slots"));
    }

    /// The names of the stage's environment, comma-separated: what the kubelet passes to the
    /// worker pods (as a ConfigMap of Airflow's settings would give them).
    fn pod_env_names(&self) -> String {
        let names: Vec<&str> = self.env.iter().map(|(name, _)| name.as_str()).collect();
        names.join(",")
    }

    fn start_sim(&mut self, max_pods: Option<usize>) {
        let log = self.dir.path().join("sim.log");
        let mut command = Command::new(podstream_binary());
        command
            .args([
                "sim",
                "--listen",
                "127.0.0.1:0",
                "--kubelet",
                "--kubeconfig",
            ])
            .arg(&self.kubeconfig)
            .arg("--kubelet-dir")
            .arg(self.dir.path().join("kubelet"))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(max) = max_pods {
            command.arg("--kubelet-max-pods").arg(max.to_string());
        }
        command.arg("--kubelet-env").arg(self.pod_env_names());
        let sim = Service::spawn("podstream sim", command, log);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.kubeconfig.exists() || !sim_ready(&sim.log) {
            assert!(
                Instant::now() < deadline,
                "the simulator did not start:\n{}",
                sim.tail(20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.sim = Some(sim);
    }

    /// A control plane of its own, its admin's kubeconfig as the stage's, the namespace
    /// `airflow`, and `podstream kubelet` as its node, running at most `max_pods` at once.
    fn start_control_plane(&mut self, max_pods: Option<usize>) {
        let plane =
            crate::control_plane::ControlPlane::start(crate::control_plane::Options::default());
        plane.create_namespace("airflow");
        std::fs::copy(plane.admin_kubeconfig(), &self.kubeconfig)
            .unwrap_or_else(|e| panic!("copying the kubeconfig: {e}"));
        // Each client as a service account of its own (cluster-admin): the audit log says
        // who sent each request.
        let kubeconfig_of = |who: Deleter| {
            let account = who.account();
            plane.apply(&format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {account}\n  namespace: airflow\n---\n\
                 apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: stage-{account}\n\
                 roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\n\
                 subjects:\n- kind: ServiceAccount\n  name: {account}\n  namespace: airflow\n"
            ));
            plane.service_account_kubeconfig("airflow", account)
        };
        let scheduler = kubeconfig_of(Deleter::Scheduler).display().to_string();
        for (name, value) in &mut self.env {
            if name == "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE" {
                value.clone_from(&scheduler);
            }
        }
        self.podstream_kubeconfig = kubeconfig_of(Deleter::Podstream);
        let kubelet_kubeconfig = kubeconfig_of(Deleter::Kubelet);
        let mut command = Command::new(podstream_binary());
        command
            .args(["kubelet", "--namespace", "airflow", "--dir"])
            .arg(self.dir.path().join("kubelet"))
            .arg("--env")
            .arg(self.pod_env_names())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("KUBECONFIG", &kubelet_kubeconfig);
        if let Some(max) = max_pods {
            command.arg("--max-pods").arg(max.to_string());
        }
        let kubelet = Service::spawn(
            "podstream kubelet",
            command,
            self.dir.path().join("kubelet.log"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !kubectl(
            &self.kubeconfig,
            &["get", "node", podstream_sim::kubelet::NODE_NAME],
        )
        .0
        {
            assert!(
                Instant::now() < deadline,
                "the kubelet did not register its node:\n{}",
                kubelet.tail(20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.sim = Some(kubelet);
        self.control_plane = Some(plane);
    }

    /// `podstream run` on the nats-server, the simulator and the metadata DB, when the
    /// schedulers run podstream's executor (`--task-failures executor --collect-pods`, only
    /// signed pods acting) or the stock one beside podstream's sink (`--task-failures sink`:
    /// the stock executor signs no pod and deletes its own).
    fn start_podstream(&mut self) {
        let Some(nats) = &self.nats else {
            return;
        };
        let mut command = Command::new(podstream_binary());
        command
            .args(["run", "--namespaces", "airflow"])
            .args(["--nats", &nats.url(), "--db", &self.pg.url(DATABASE)])
            .args(
                nats.token_file()
                    .iter()
                    .flat_map(|file| [std::ffi::OsStr::new("--nats-token-file"), file.as_os_str()]),
            )
            .env("KUBECONFIG", &self.podstream_kubeconfig)
            .env("RUST_LOG", "info");
        if self.executor == Executor::Sink {
            command.args(["--task-failures", "sink"]);
        } else {
            command
                .args(["--task-failures", "executor"])
                .arg("--require-signed-pods")
                .arg("--pod-signing-key-file")
                .arg(self.dir.path().join(SIGNING_KEY_FILE))
                // Every candidate is signed: live losers and stale pods may go too, after a
                // grace period short enough for a story.
                .args(["--collect-pods", "--collect-live-pods"])
                .args([
                    "--collect-grace-seconds",
                    &COLLECT_GRACE_SECONDS.to_string(),
                ]);
        }
        let log = self.dir.path().join("podstream-run.log");
        self.podstream = Some(Service::spawn("podstream run", command, log));
    }

    /// Every DELETE of a pod so far, on a real control plane (from its audit log): who sent it,
    /// the pod's name, the answer's status. Empty on the simulator.
    pub fn pod_deletes(&self) -> Vec<(Deleter, String, u16)> {
        let Some(plane) = &self.control_plane else {
            return Vec::new();
        };
        plane
            .audit()
            .into_iter()
            .filter(|r| r.verb == "delete" && r.resource == "pods")
            .filter_map(|r| {
                let who = Deleter::ALL
                    .into_iter()
                    .find(|d| r.user == format!("system:serviceaccount:airflow:{}", d.account()))?;
                Some((who, r.name, r.code))
            })
            .collect()
    }

    /// What `podstream run` has logged so far; empty with the stock executor.
    pub fn podstream_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("podstream-run.log")).unwrap_or_default()
    }

    /// How many lines of `podstream run`'s log warn that pod `name` has no valid signature
    /// (the processor logs one per event of a foreign pod).
    pub fn unsigned_warnings(&self, name: &str) -> usize {
        self.podstream_log()
            .lines()
            .filter(|line| line.contains("without a valid signature") && line.contains(name))
            .count()
    }

    /// The URL of the nats-server podstream runs on, its token as user info (for
    /// `podstream_bus::connect`); `None` with the stock executor.
    pub fn nats_url(&self) -> Option<String> {
        self.nats.as_ref().map(crate::nats::NatsServer::client_url)
    }

    /// Starts one Airflow component (`scheduler`, `api-server`, `dag-processor`); its index.
    pub fn start_component(&mut self, component: &str) -> usize {
        let log = self
            .dir
            .path()
            .join(format!("{component}-{}.log", self.components.len()));
        let mut command = self.airflow.python(&self.dir.path().join("airflow-home"));
        command
            .arg(self.airflow.venv_bin().join("airflow"))
            .arg(component)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        self.components
            .push(Service::spawn(component, command, log));
        let index = self.components.len() - 1;
        self.note(format!("started {component} #{index}"));
        index
    }

    /// Starts `command` as a component named `name` (its log kept, its processes killed with
    /// the stage's); its index.
    pub fn start_process(&mut self, name: &str, command: Command) -> usize {
        let log = self
            .dir
            .path()
            .join(format!("{name}-{}.log", self.components.len()));
        self.components.push(Service::spawn(name, command, log));
        let index = self.components.len() - 1;
        self.note(format!("started {name} #{index}"));
        index
    }

    /// The stage's own control plane, on [`Kubernetes::Real`].
    pub fn control_plane(&self) -> Option<&crate::control_plane::ControlPlane> {
        self.control_plane.as_ref()
    }

    /// The metadata database's URL, as its superuser `postgres` (with its password).
    pub fn database_url(&self) -> String {
        self.pg.url(DATABASE)
    }

    /// The whole logs of every component of that name, in start order.
    pub fn logs_of(&self, name: &str) -> Vec<String> {
        self.components
            .iter()
            .filter(|c| c.name == name)
            .map(|c| std::fs::read_to_string(&c.log).unwrap_or_default())
            .collect()
    }

    /// The pid of a component's process (the leader of its process group).
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.components.get(index).map(|c| c.child.id())
    }

    /// The pid of `podstream run`, with [`Executor::Podstream`] and [`Executor::Sink`].
    pub fn podstream_pid(&self) -> Option<u32> {
        self.podstream.as_ref().map(|p| p.child.id())
    }

    /// The index of the first component of that name.
    pub fn component(&self, name: &str) -> Option<usize> {
        self.components.iter().position(|c| c.name == name)
    }

    /// Sends a signal to a component's process group (SIGSTOP, SIGCONT, SIGKILL).
    pub fn signal(&self, index: usize, signal: Signal) {
        if let Some(component) = self.components.get(index) {
            self.note(format!("{signal} to {} #{index}", component.name));
            component.signal(signal);
        }
    }

    /// Writes a line into the timeline.
    pub fn note(&self, what: impl Into<String>) {
        if let Some(recorder) = &self.recorder {
            recorder.push(format!("** {}", what.into()));
        }
    }

    /// Samples task instances, scheduler jobs and callbacks into the timeline.
    pub fn sample(&self) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let tis = self.query(
            "SELECT task_id, try_number, coalesce(state, 'none'), coalesce(queued_by_job_id::text, '-') \
             FROM task_instance ORDER BY task_id",
        );
        let jobs = self.query(
            "SELECT id, coalesce(state, 'none') FROM job WHERE job_type = 'SchedulerJob' ORDER BY id",
        );
        let rows = tis
            .iter()
            .filter(|r| r.len() == 4)
            .map(|r| {
                (
                    format!("ti {}", r[0]),
                    format!(
                        "TI {} try {}: {} (queued_by_job_id {})",
                        r[0], r[1], r[2], r[3]
                    ),
                )
            })
            .chain(jobs.iter().filter(|r| r.len() == 2).map(|r| {
                (
                    format!("job {}", r[0]),
                    format!("scheduler job {}: {}", r[0], r[1]),
                )
            }));
        recorder.rows(rows);
        let mut seen = recorder
            .markers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for marker in self.markers() {
            if seen.insert(marker.clone()) {
                recorder.push(format!("callback {marker}"));
            }
        }
    }

    /// The timeline so far.
    pub fn timeline(&self) -> String {
        self.sample();
        self.recorder
            .as_ref()
            .map(Recorder::render)
            .unwrap_or_default()
    }

    /// Samples until `done` holds; panics with the timeline and logs after `timeout`.
    pub fn wait_until(&self, what: &str, timeout: Duration, done: impl Fn(&RealAirflow) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            self.sample();
            if done(self) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "waited {timeout:?} for {what}\n{}\n{}\n{}\n{}",
                self.timeline(),
                self.failed_pods(),
                self.database_state(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Creates a pod through kubectl, as a person or another controller would.
    pub fn create_pod(&self, pod: &Value) {
        let name = pod["metadata"]["name"].as_str().unwrap_or("pod");
        let file = self.dir.path().join(format!("{name}.json"));
        std::fs::write(&file, pod.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let (ok, _, stderr) = kubectl(
            &self.kubeconfig,
            &["create", "-f", &file.display().to_string()],
        );
        assert!(ok, "kubectl create {name}: {stderr}");
        self.note(format!("created pod {name}"));
    }

    /// Writes a pod's status through kubectl (a merge patch of the `status` subresource), as a
    /// kubelet would.
    pub fn patch_pod_status(&self, namespace: &str, name: &str, status: &Value) {
        let patch = json!({ "status": status }).to_string();
        let (ok, _, stderr) = kubectl(
            &self.kubeconfig,
            &[
                "patch",
                "pod",
                "-n",
                namespace,
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch,
            ],
        );
        assert!(
            ok,
            "kubectl patch pod {name} --subresource=status: {stderr}"
        );
        self.note(format!("wrote the status of pod {name}"));
    }

    /// Deletes a pod through kubectl (graceful, without waiting for it to go), as a person would.
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let (ok, _, stderr) = kubectl(
            &self.kubeconfig,
            &["delete", "pod", "-n", namespace, name, "--wait=false"],
        );
        assert!(ok, "kubectl delete pod {name}: {stderr}");
        self.note(format!("deleted pod {name}"));
    }

    /// The environment Airflow and its worker pods run with.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Waits for the DAG's first run to end, and returns its state.
    ///
    /// # Panics
    /// When it does not end within `timeout` (with the components' logs).
    pub fn wait_for_run(&self, dag_id: &str, timeout: Duration) -> String {
        let ended = |real: &RealAirflow| {
            real.query(&format!(
                "SELECT state FROM dag_run WHERE dag_id = '{dag_id}' ORDER BY id LIMIT 1"
            ))
            .into_iter()
            .find_map(|row| row.into_iter().next())
            .filter(|state| state == "success" || state == "failed")
        };
        self.wait_until(&format!("the run of {dag_id} to end"), timeout, |real| {
            ended(real).is_some()
        });
        ended(self).unwrap_or_default()
    }

    /// The DAG's task instances, by task id.
    pub fn tis(&self, dag_id: &str) -> Vec<TiRow> {
        self.query(&format!(
            "SELECT task_id, coalesce(state, ''), try_number FROM task_instance \
             WHERE dag_id = '{dag_id}' ORDER BY task_id"
        ))
        .into_iter()
        .filter_map(|row| {
            Some(TiRow {
                task_id: row.first()?.clone(),
                state: row.get(1)?.clone(),
                try_number: row.get(2)?.parse().ok()?,
            })
        })
        .collect()
    }

    /// Rows of a query on Airflow's database.
    pub fn query(&self, sql: &str) -> Vec<Vec<String>> {
        self.pg.query(DATABASE, sql)
    }

    /// The callbacks' markers, `kind.dag.task.try`, sorted.
    pub fn markers(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.markers)
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        // Drop the unique suffix that keeps two calls apart.
                        name.rsplit_once('.').map(|(head, _)| head.to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The callbacks' markers once there are at least `count` and a moment more has brought
    /// no other (a failure callback runs in the DAG processor after the TI's state is
    /// written, so it can come after the run has ended); what is there after `timeout`
    /// otherwise.
    pub fn markers_settled(&self, count: usize, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        while self.markers().len() < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(250));
        }
        std::thread::sleep(Duration::from_secs(3));
        self.markers()
    }

    /// The pods in the simulator now.
    pub fn pods(&self) -> Vec<Value> {
        let (ok, stdout, stderr) = kubectl(&self.kubeconfig, &["get", "pods", "-A", "-o", "json"]);
        assert!(ok, "kubectl get pods: {stderr}");
        serde_json::from_str::<Value>(&stdout)
            .ok()
            .and_then(|list| list["items"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Why each failed pod failed, as far as the cluster can say: its reason, each
    /// container's exit code and reason, and the last lines of its log. Empty when no pod
    /// failed.
    pub fn failed_pods(&self) -> String {
        let mut report = Vec::new();
        for pod in self.pods() {
            if pod["status"]["phase"] != "Failed" {
                continue;
            }
            let name = pod["metadata"]["name"].as_str().unwrap_or("?");
            let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
            let try_number = pod["metadata"]["annotations"]["try_number"]
                .as_str()
                .unwrap_or("?");
            let containers: Vec<String> = pod["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|status| {
                    let ended = &status["state"]["terminated"];
                    ended.is_object().then(|| {
                        format!(
                            "{} exited {} ({})",
                            status["name"].as_str().unwrap_or("?"),
                            ended["exitCode"],
                            ended["reason"].as_str().unwrap_or("no reason")
                        )
                    })
                })
                .collect();
            let (_, log, _) = kubectl(
                &self.kubeconfig,
                &["logs", "-n", namespace, name, "--tail", "20"],
            );
            report.push(format!(
                "--- pod {name} (try {try_number}) failed: reason {}; {}\n{}",
                pod["status"]["reason"].as_str().unwrap_or("none"),
                if containers.is_empty() {
                    "no container ended".to_owned()
                } else {
                    containers.join(", ")
                },
                log.lines()
                    .map(|line| format!("    {line}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
        report.join("\n")
    }

    /// Waits up to `timeout` for `done` to hold over the pods.
    pub fn wait_for_pods(&self, timeout: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let pods = self.pods();
            if done(&pods) || Instant::now() >= deadline {
                return pods;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// What the database says that the timeline does not: whether each DAG is live and
    /// unpaused (a scheduler examines only those runs), and every open transaction (a run
    /// whose row a dead session still locks is skipped by every scheduler).
    fn database_state(&self) -> String {
        let rows = |sql: &str| {
            self.query(sql)
                .iter()
                .map(|row| format!("  {}", row.join(" | ")))
                .collect::<Vec<_>>()
                .join("\n")
        };
        format!(
            "--- dags (dag_id | is_active, before Airflow 3 | is_stale, from Airflow 3 | is_paused):\n{}\n\
             --- open transactions (pid | state | age | query):\n{}",
            // Read through to_jsonb: Airflow 3 replaced `is_active` with `is_stale`.
            rows(
                "SELECT dag_id, to_jsonb(d) ->> 'is_active', to_jsonb(d) ->> 'is_stale', \
                 is_paused FROM dag d ORDER BY dag_id"
            ),
            rows(
                "SELECT pid, state, now() - xact_start, \
                 regexp_replace(left(query, 100), '\\s+', ' ', 'g') FROM pg_stat_activity \
                 WHERE datname = current_database() AND xact_start IS NOT NULL \
                 AND pid <> pg_backend_pid() ORDER BY xact_start"
            )
        )
    }

    /// The last lines of every process's log.
    pub fn logs(&self) -> String {
        self.sim
            .iter()
            .chain(&self.podstream)
            .chain(&self.components)
            .map(|s| s.tail(30))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RealAirflow {
    fn drop(&mut self) {
        self.recorder = None;
        for component in self.components.iter_mut().rev() {
            component.stop();
        }
        if let Some(podstream) = self.podstream.as_mut() {
            podstream.stop();
        }
        if let Some(sim) = self.sim.as_mut() {
            sim.stop();
        }
        self.control_plane = None;
    }
}

/// A process as `/proc/<pid>/stat` shows it.
struct Process {
    pid: u32,
    parent: u32,
    group: Pid,
    zombie: bool,
}

/// Every process on the machine now.
fn processes() -> Vec<Process> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // After the command's closing parenthesis: state, parent, process group.
            let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
            let zombie = fields.next()? == "Z";
            let parent = fields.next()?.parse().ok()?;
            let group = Pid::from_raw(fields.next()?.parse().ok()?);
            Some(Process {
                pid,
                parent,
                group,
                zombie,
            })
        })
        .collect()
}

/// The process groups of every process descended from `root`.
fn descendant_groups(root: u32) -> BTreeSet<Pid> {
    let all = processes();
    let mut tree = BTreeSet::from([root]);
    let mut groups = BTreeSet::new();
    loop {
        let before = tree.len();
        for process in &all {
            if tree.contains(&process.parent) && tree.insert(process.pid) {
                groups.insert(process.group);
            }
        }
        if tree.len() == before {
            return groups;
        }
    }
}

/// Whether any live process is in one of `groups`.
fn any_alive_in(groups: &BTreeSet<Pid>) -> bool {
    processes()
        .iter()
        .any(|process| !process.zombie && groups.contains(&process.group))
}

fn sim_ready(log: &Path) -> bool {
    std::fs::File::open(log)
        .map(|f| {
            BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .any(|l| l.starts_with("listening on "))
        })
        .unwrap_or(false)
}

/// Airflow's settings for the tests, as `AIRFLOW__*` variables (the kubelet passes them to the
/// worker pods by name, as a ConfigMap would give them): PostgreSQL, the KubernetesExecutor on
/// the simulator, short scheduler intervals, and for 3.x the execution API's address.
fn environment(
    airflow: Airflow,
    dags: Dags,
    pg: &PgCluster,
    kubeconfig: &Path,
    markers: &Path,
    home: &Path,
) -> Vec<(String, String)> {
    let tests = workspace_root().join("stage/airflow");
    let sql = pg
        .url(DATABASE)
        .replacen("postgres://", "postgresql+psycopg2://", 1);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![airflow.venv_bin()];
    paths.extend(std::env::split_paths(&path));
    let path = std::env::join_paths(paths).unwrap_or(path);
    let mut env: Vec<(String, String)> = [
        ("PATH", path.to_string_lossy().as_ref()),
        ("AIRFLOW_HOME", &home.display().to_string()),
        ("AIRFLOW__CORE__LOAD_EXAMPLES", "False"),
        ("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor"),
        (
            "AIRFLOW__CORE__DAGS_FOLDER",
            &dags.folder().display().to_string(),
        ),
        ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", &sql),
        ("AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE", "airflow"),
        ("AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER", "False"),
        (
            "AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE",
            &kubeconfig.display().to_string(),
        ),
        (
            "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE",
            &tests.join("pod_template.yaml").display().to_string(),
        ),
        (
            "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY",
            "podstream-sim/airflow",
        ),
        (
            "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG",
            "local",
        ),
        ("AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", "1"),
        ("AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL", "5"),
        ("AIRFLOW__SCHEDULER__DAG_DIR_LIST_INTERVAL", "5"),
        // A stopped scheduler counts as dead after 10 s, and adoption is checked every 5 s
        // (defaults 30 s and 300 s), so the stories play out in a minute.
        ("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", "10"),
        ("AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL", "5"),
        // A task whose process died (its pod killed) is found in 10 s, not 5 minutes: Airflow
        // 2.x fails a running task that way, not from the executor's report. The check runs
        // every 20 s (default 10 s): until the DAG processor has run the failure callback the
        // TI is still `running`, so a check coming sooner than that sends the callback again,
        // and a loaded machine's DAG processor can take longer than 5 s.
        ("AIRFLOW__SCHEDULER__SCHEDULER_ZOMBIE_TASK_THRESHOLD", "10"),
        ("AIRFLOW__SCHEDULER__ZOMBIE_DETECTION_INTERVAL", "20"),
        ("PODSTREAM_LONG_TASK_SECONDS", "50"),
        ("PODSTREAM_MARKERS", &markers.display().to_string()),
        ("PYTHONPATH", &tests.join("lib").display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    if airflow.is_3() {
        let port = free_port().to_string();
        for (key, value) in [
            ("AIRFLOW__API__HOST", "127.0.0.1".to_owned()),
            ("AIRFLOW__API__PORT", port.clone()),
            (
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
                format!("http://127.0.0.1:{port}/execution/"),
            ),
            (
                "AIRFLOW__API_AUTH__JWT_SECRET",
                "podstream-tests-only".to_owned(),
            ),
            ("AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL", "5".to_owned()),
            // A task's calls to the execution API time out after 5 s by default (3.1.1 on):
            // on a loaded 2-core machine the API server, starting beside the scheduler,
            // answered a task's first PATCH in 10 s, the task died of the ReadTimeout and
            // stock_airflow_3_3_adoption never saw its task adopted.
            ("AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT", "60".to_owned()),
        ] {
            env.push((key.to_owned(), value));
        }
    }
    env
}

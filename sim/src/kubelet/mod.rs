//! A kubelet for the simulator: each pod, once created, runs the way a node would run it. Its
//! first container's command runs as a local process (there are no images), and the kubelet
//! writes the status a real one writes: `Pending` (`ContainerCreating`) → `Running` →
//! `Succeeded`/`Failed` from the exit code. A graceful delete sends SIGTERM, then SIGKILL when
//! the grace period ends, and the pod goes once its process is gone. Faults are played on
//! demand ([`Fault`]), and a node with `max_pods` leaves the rest Pending and unschedulable.
//! No pod's process outlives the kubelet: dropped, it kills them; killed, a reaper of its own
//! session kills their process groups (and those that left them).
//!
//! - [`plan`]: what to run for a pod (pure); [`status`]: the status writes (pure);
//! - this file: the loop that follows the cluster's changes, and one task per running pod.

mod api;
pub mod plan;
pub mod status;

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use plan::{FAULT_AFTER_ANNOTATION, FAULT_ANNOTATION, Fault, Node};

use crate::cluster::Cluster;
use crate::container::{ContainerState, log_path, set_container};
use crate::status::ApiError;
use crate::store::Change;
use api::{NodeApi, Observed};
use plan::{Launch, Refusal};

/// The node name the kubelet binds pods to.
pub const NODE_NAME: &str = "podstream-sim-node";
/// The node's address, and every pod's.
const NODE_IP: &str = "127.0.0.1";

/// Why the kubelet did not start: its directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The directory could not be made, read or resolved.
    #[error("{what} the kubelet's directory {dir}")]
    Dir {
        /// What was done to it.
        what: &'static str,
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The directory is another user's, or others may write to it.
    #[error(
        "the kubelet's directory {dir} belongs to uid {uid} with mode {mode:o}: it must be this user's (uid {me}) and writable by no one else"
    )]
    NotPrivate {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
        /// This user.
        me: u32,
    },
}

impl KubeletError {
    fn dir(what: &'static str, dir: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self {
        let dir = dir.to_owned();
        move |source| KubeletError::Dir { what, dir, source }
    }
}

/// The kubelet's directory, made for this user alone (0700) and resolved. An existing one
/// must be this user's and closed to others' writes: pods' programs, logs and working
/// directories live there, and a directory another user prepared could swap them.
fn prepare(config: &KubeletConfig) -> Result<PathBuf, KubeletError> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let root = &config.root;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(KubeletError::dir("creating", root))?;
    let found = std::fs::metadata(root).map_err(KubeletError::dir("reading", root))?;
    let me = nix::unistd::geteuid().as_raw();
    if found.uid() != me || found.mode() & 0o022 != 0 {
        return Err(KubeletError::NotPrivate {
            dir: root.clone(),
            uid: found.uid(),
            mode: found.mode() & 0o7777,
            me,
        });
    }
    root.canonicalize()
        .map_err(KubeletError::dir("resolving", root))
}

/// How the kubelet runs.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Where pods get their scratch working directories and logs.
    pub root: PathBuf,
    /// At most this many pods run at once; the rest stay Pending (`Unschedulable`).
    pub max_pods: Option<usize>,
    /// Names of the kubelet's own environment variables every container gets, as an image's
    /// `ENV` would give them. Nothing else of the kubelet's environment reaches a pod.
    pub passed_env: Vec<String>,
}

/// One pod, by the identity that outlives a re-creation under the same name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PodId {
    namespace: String,
    name: String,
    uid: String,
}

/// What the loop tells a pod's task.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// A graceful delete: SIGTERM now, SIGKILL after the grace period.
    Terminate(Duration),
    /// The pod is gone: kill what runs, write nothing.
    Kill,
    /// Play a fault now.
    Fault(Fault),
}

/// A pod the kubelet runs: how to reach its task, and its process group once started.
struct Running {
    orders: mpsc::UnboundedSender<Order>,
    process_group: Arc<Mutex<Option<Pid>>>,
}

type Registry = Arc<Mutex<HashMap<PodId, Running>>>;

/// A running kubelet. Dropping it kills every process it started.
pub struct Kubelet {
    pods: Registry,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet").finish_non_exhaustive()
    }
}

/// What every pod task shares.
struct Host {
    api: NodeApi,
    node: Node,
    root: PathBuf,
    /// What every container starts with, before the pod's own `env` ([`base_environment`]).
    base_env: Vec<(String, String)>,
    reaper: Reaper,
}

/// A process of its own session that SIGKILLs every pod's process group still running when the
/// kubelet's process ends, however it ends: a SIGKILL runs no drop, and Airflow's task
/// processes must not outlive the node that ran them. It learns the groups through a pipe and
/// acts when the pipe closes.
struct Reaper {
    orders: Mutex<Option<std::process::ChildStdin>>,
}

/// The reaper's program: `add G` and `del G` lines keep the set of live groups; at the end of
/// its input, it kills them.
const REAPER: &str = "declare -A live
while read -r op group; do
  case \"$op\" in
    add) live[$group]=1 ;;
    del) unset \"live[$group]\" ;;
  esac
done
for group in \"${!live[@]}\"; do kill -9 -- \"-$group\" 2>/dev/null; done";

impl Reaper {
    /// Starts the reaper; without bash or setsid it warns and reaps nothing.
    fn start() -> Reaper {
        let spawned = std::process::Command::new("setsid")
            .args(["bash", "-c", REAPER])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let orders = match spawned {
            Ok(mut child) => child.stdin.take(),
            Err(error) => {
                tracing::warn!(%error, "no reaper: pods' processes may outlive a killed kubelet");
                None
            }
        };
        Reaper {
            orders: Mutex::new(orders),
        }
    }

    fn tell(&self, op: &str, group: Pid) {
        use std::io::Write as _;
        let mut orders = self.orders.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pipe) = orders.as_mut()
            && writeln!(pipe, "{op} {group}").is_err()
        {
            *orders = None;
        }
    }
}

impl Kubelet {
    /// Starts running the cluster's pods (those already there first) on the current runtime.
    pub fn start(cluster: Cluster, config: KubeletConfig) -> Result<Kubelet, KubeletError> {
        let root = prepare(&config)?;
        cluster.attach_pod_logs(root.clone());
        Ok(Kubelet::run(
            NodeApi::Simulated(cluster),
            root,
            config,
            None,
        ))
    }

    /// Attaches to a real API server, as `podstream kubelet` does: registers the node (its
    /// heartbeat Lease renewed), binds the pods of `namespace` (`None`: of every namespace)
    /// that name no node, runs them and writes their status through the status subresource.
    /// Pod logs stay in `config.root`.
    pub fn attach(
        client: kube::Client,
        namespace: Option<String>,
        config: KubeletConfig,
    ) -> Result<Kubelet, KubeletError> {
        let root = prepare(&config)?;
        let heartbeat = tokio::spawn(api::register_node(
            client.clone(),
            NODE_NAME.to_owned(),
            NODE_IP.to_owned(),
        ));
        Ok(Kubelet::run(
            NodeApi::Remote(client, namespace),
            root,
            config,
            Some(heartbeat),
        ))
    }

    fn run(
        api: NodeApi,
        root: PathBuf,
        config: KubeletConfig,
        heartbeat: Option<JoinHandle<()>>,
    ) -> Kubelet {
        let pods: Registry = Arc::default();
        let node = Arc::new(Host {
            api: api.clone(),
            node: Node {
                name: NODE_NAME.to_owned(),
                ip: NODE_IP.to_owned(),
            },
            root,
            base_env: base_environment(&config.passed_env),
            reaper: Reaper::start(),
        });
        let (changes, observed) = mpsc::unbounded_channel();
        let mut tasks = vec![
            tokio::spawn(api.follow(changes)),
            tokio::spawn(hand_escapes_to_the_reaper(node.clone(), pods.clone())),
            tokio::spawn(follow(node, config.max_pods, pods.clone(), observed)),
        ];
        tasks.extend(heartbeat);
        Kubelet { pods, tasks }
    }

    /// Plays `fault` on a pod the kubelet runs now (control API), or 404.
    pub fn inject(&self, namespace: &str, name: &str, fault: Fault) -> Result<(), ApiError> {
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.iter()
            .find(|(id, _)| id.namespace == namespace && id.name == name)
            .and_then(|(_, running)| running.orders.send(Order::Fault(fault)).ok())
            .ok_or_else(|| ApiError::not_found("", "pods", name))
    }

    /// How many pods have a task (running, or waiting to end).
    pub fn active(&self) -> usize {
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        for running in pods.values() {
            let group = *running
                .process_group
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(group) = group {
                signal_container(group, Signal::SIGKILL);
            }
        }
    }
}

/// Signals a container: its process group and, for SIGKILL, every process descended from its
/// first process, also those that left the group (Airflow 2's task runner calls `setsid`): a
/// kubelet's SIGKILL ends the whole container, whatever sessions its processes made.
fn signal_container(group: Pid, signal: Signal) {
    if signal == Signal::SIGKILL {
        for pid in descendants(group.as_raw()) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
    let _ = killpg(group, signal);
}

/// Once a second, finds the processes that left a running container's group (Airflow 2's task
/// runner calls `setsid`) by parent links while they have them, and keeps the reaper's list of
/// their groups current: one read of `/proc` for all pods.
async fn hand_escapes_to_the_reaper(node: Arc<Host>, pods: Registry) {
    let mut known: HashSet<i32> = HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let groups: Vec<i32> = pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(|running| {
                *running
                    .process_group
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
            })
            .map(Pid::as_raw)
            .collect();
        let escaped: HashSet<i32> = if groups.is_empty() {
            HashSet::new()
        } else {
            let parents = parent_links();
            groups
                .iter()
                .flat_map(|&group| descendants_in(&parents, group))
                .filter(|&pid| {
                    nix::unistd::getpgid(Some(Pid::from_raw(pid))).is_ok_and(|g| g.as_raw() == pid)
                })
                .collect()
        };
        for pid in escaped.difference(&known) {
            node.reaper.tell("add", Pid::from_raw(*pid));
        }
        for pid in known.difference(&escaped) {
            node.reaper.tell("del", Pid::from_raw(*pid));
        }
        known = escaped;
    }
}

/// Every process below `root` by parent links in `/proc` (none where `/proc` cannot be read).
fn descendants(root: i32) -> Vec<i32> {
    descendants_in(&parent_links(), root)
}

/// Every process with its parent, from `/proc`.
fn parent_links() -> Vec<(i32, i32)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
            let after = stat.get(stat.rfind(')')? + 1..)?;
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// Every process below `root` by the parent links given.
fn descendants_in(parents: &[(i32, i32)], root: i32) -> Vec<i32> {
    let mut found = vec![root];
    let mut grew = true;
    while grew {
        grew = false;
        for (pid, ppid) in parents {
            if found.contains(ppid) && !found.contains(pid) {
                found.push(*pid);
                grew = true;
            }
        }
    }
    found.retain(|pid| *pid != root);
    found
}

fn id_of(pod: &Value) -> PodId {
    let meta = &pod["metadata"];
    let text = |f: &str| meta[f].as_str().unwrap_or_default().to_owned();
    PodId {
        namespace: text("namespace"),
        name: text("name"),
        uid: text("uid"),
    }
}

/// Pods the loop has started and pods waiting for room.
struct Admission {
    max_pods: Option<usize>,
    started: HashSet<PodId>,
    waiting: VecDeque<PodId>,
}

impl Admission {
    fn has_room(&self) -> bool {
        self.max_pods.is_none_or(|max| self.started.len() < max)
    }
}

/// Follows the pods' changes: starts new pods, passes deletes on, admits waiting pods when
/// room frees up.
async fn follow(
    node: Arc<Host>,
    max_pods: Option<usize>,
    pods: Registry,
    mut observed: mpsc::UnboundedReceiver<Observed>,
) {
    let (finished_tx, mut finished) = mpsc::unbounded_channel::<PodId>();
    let mut admission = Admission {
        max_pods,
        started: HashSet::new(),
        waiting: VecDeque::new(),
    };
    loop {
        tokio::select! {
            change = observed.recv() => match change {
                None => return,
                Some(Observed::Resync(now)) => {
                    resync(&node, &pods, &finished_tx, &mut admission, &now);
                }
                Some(Observed::Change(change, pod)) => {
                    observe(&node, &pods, &finished_tx, &mut admission, change, &pod);
                }
            },
            Some(done) = finished.recv() => {
                admission.started.remove(&done);
                while admission.has_room() {
                    let Some(next) = admission.waiting.pop_front() else { break };
                    if node.api.pod(&next).await.is_some() {
                        start(&node, &pods, &finished_tx, &mut admission, next);
                    }
                }
            }
        }
    }
}

/// Takes the pods as they are now: new ones start, ones that are gone are killed.
fn resync(
    node: &Arc<Host>,
    pods: &Registry,
    finished: &mpsc::UnboundedSender<PodId>,
    admission: &mut Admission,
    current: &[Value],
) {
    let mut present = HashSet::new();
    for pod in current {
        present.insert(id_of(pod));
        let change = if pod["metadata"]["deletionTimestamp"].is_string() {
            Change::Modified
        } else {
            Change::Added
        };
        observe(node, pods, finished, admission, change, pod);
    }
    let registry = pods.lock().unwrap_or_else(PoisonError::into_inner);
    for (id, running) in registry.iter() {
        if !present.contains(id) {
            let _ = running.orders.send(Order::Kill);
        }
    }
    drop(registry);
    admission.waiting.retain(|id| present.contains(id));
}

fn observe(
    node: &Arc<Host>,
    pods: &Registry,
    finished: &mpsc::UnboundedSender<PodId>,
    admission: &mut Admission,
    change: Change,
    pod: &Value,
) {
    let id = id_of(pod);
    let terminating = pod["metadata"]["deletionTimestamp"].is_string();
    let bound_here = pod["spec"]["nodeName"]
        .as_str()
        .is_none_or(|n| n.is_empty() || n == node.node.name);
    let registry = pods.lock().unwrap_or_else(PoisonError::into_inner);
    let running = registry.get(&id).map(|r| r.orders.clone());
    drop(registry);
    match change {
        Change::Deleted => {
            if let Some(orders) = running {
                let _ = orders.send(Order::Kill);
            }
            admission.waiting.retain(|w| *w != id);
        }
        _ if terminating => {
            if let Some(orders) = running {
                let grace = pod["metadata"]["deletionGracePeriodSeconds"]
                    .as_u64()
                    .unwrap_or(30);
                let _ = orders.send(Order::Terminate(Duration::from_secs(grace)));
            } else if bound_here {
                // Nothing runs for it (never started, waiting, or finished): it goes at once.
                admission.waiting.retain(|w| *w != id);
                let api = node.api.clone();
                tokio::spawn(async move { api.remove(&id).await });
            }
        }
        Change::Added => {
            let pending = pod["status"]["phase"]
                .as_str()
                .is_none_or(|p| p == "Pending");
            let unbound = pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty);
            if !pending
                || !unbound
                || admission.started.contains(&id)
                || admission.waiting.contains(&id)
            {
                return;
            }
            if admission.has_room() {
                start(node, pods, finished, admission, id);
            } else {
                let max = admission.max_pods.unwrap_or_default();
                let api = node.api.clone();
                let waiting = id.clone();
                tokio::spawn(async move {
                    api.write_status(&waiting, |p| status::unschedulable(p, max))
                        .await;
                });
                admission.waiting.push_back(id);
            }
        }
        Change::Modified => {}
    }
}

fn start(
    node: &Arc<Host>,
    pods: &Registry,
    finished: &mpsc::UnboundedSender<PodId>,
    admission: &mut Admission,
    id: PodId,
) {
    let (orders, inbox) = mpsc::unbounded_channel();
    let process_group = Arc::new(Mutex::new(None));
    pods.lock().unwrap_or_else(PoisonError::into_inner).insert(
        id.clone(),
        Running {
            orders,
            process_group: process_group.clone(),
        },
    );
    admission.started.insert(id.clone());
    let node = node.clone();
    let pods = pods.clone();
    let finished = finished.clone();
    tokio::spawn(async move {
        run_pod(&node, &id, inbox, process_group).await;
        pods.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        let _ = finished.send(id);
    });
}

/// How a pod's process ended, beside its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// It exited, or was stopped by a graceful delete.
    Exited,
    /// Killed for memory.
    OomKilled,
    /// Evicted.
    Evicted,
    /// The node was lost: no status, the pod deleted.
    NodeLost,
    /// The pod is gone already.
    Gone,
}

/// Runs one pod from creation to its end.
async fn run_pod(
    node: &Host,
    id: &PodId,
    mut orders: mpsc::UnboundedReceiver<Order>,
    process_group: Arc<Mutex<Option<Pid>>>,
) {
    let Some(pod) = node.api.pod(id).await else {
        return;
    };
    let container = pod["spec"]["containers"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let api = &node.api;
    if !api.bind(id, &node.node.name).await {
        return;
    }
    api.write_status(id, |pod| status::scheduled(pod, &node.node, &container))
        .await;
    let launch = match plan::plan(&pod, &node.node) {
        Ok(launch) => launch,
        Err(Refusal::CannotRun(message)) => {
            tracing::info!(pod = %id.name, namespace = %id.namespace, %message, "container cannot run");
            api.write_status(id, |pod| {
                status::terminated(pod, &container, 128, "ContainerCannotRun", &message)
            })
            .await;
            return;
        }
        Err(Refusal::Config(message)) => {
            tracing::info!(pod = %id.name, namespace = %id.namespace, %message, "container config error");
            let state = ContainerState::Waiting {
                reason: "CreateContainerConfigError".into(),
                message,
            };
            api.write_status(id, |pod| set_container(pod, &container, &state))
                .await;
            stay_pending(node, id, &mut orders).await;
            return;
        }
    };
    if matches!(launch.fault, Some((Fault::ImagePull, _))) {
        for reason in ["ErrImagePull", "ImagePullBackOff"] {
            let state = ContainerState::Waiting {
                reason: reason.into(),
                message: "podstream simulator fault: image-pull".into(),
            };
            api.write_status(id, |pod| set_container(pod, &container, &state))
                .await;
        }
        stay_pending(node, id, &mut orders).await;
        return;
    }
    let mut child = match spawn(node, id, &launch) {
        Ok(child) => child,
        Err(message) => {
            tracing::info!(pod = %id.name, namespace = %id.namespace, %message, "container cannot run");
            api.write_status(id, |pod| {
                status::terminated(pod, &container, 128, "ContainerCannotRun", &message)
            })
            .await;
            return;
        }
    };
    let group = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .map(Pid::from_raw);
    *process_group.lock().unwrap_or_else(PoisonError::into_inner) = group;
    if let Some(group) = group {
        node.reaper.tell("add", group);
    }
    let signal = |signal: Signal| {
        if let Some(group) = group {
            signal_container(group, signal);
        }
    };
    api.write_status(id, |pod| {
        status::running(pod, &node.node, &launch.container)
    })
    .await;
    tracing::info!(pod = %id.name, namespace = %id.namespace, program = %launch.program, "container started");

    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let mut fault_at = launch
        .fault
        .map_or(far, |(_, after)| Instant::now() + after);
    let mut pending_fault = launch.fault.map(|(fault, _)| fault);
    let mut kill_at = far;
    let mut terminating = false;
    let mut ending = Ending::Exited;
    let exit = loop {
        tokio::select! {
            exit = child.wait() => break exit,
            order = orders.recv() => match order {
                Some(Order::Terminate(grace)) if !terminating => {
                    terminating = true;
                    signal(Signal::SIGTERM);
                    kill_at = Instant::now() + grace;
                }
                Some(Order::Terminate(_)) => {}
                Some(Order::Fault(fault)) => {
                    pending_fault = Some(fault);
                    fault_at = Instant::now();
                }
                Some(Order::Kill) | None => {
                    ending = Ending::Gone;
                    signal(Signal::SIGKILL);
                }
            },
            () = tokio::time::sleep_until(kill_at) => {
                signal(Signal::SIGKILL);
                kill_at = far;
            }
            () = tokio::time::sleep_until(fault_at) => {
                fault_at = far;
                ending = match pending_fault.take() {
                    Some(Fault::OomKilled) => Ending::OomKilled,
                    Some(Fault::Evicted) => Ending::Evicted,
                    Some(Fault::NodeLost) => Ending::NodeLost,
                    Some(Fault::ImagePull) | None => continue,
                };
                signal(Signal::SIGKILL);
            }
        }
    };
    // Whatever the task left behind in its process group goes with it.
    signal(Signal::SIGKILL);
    if let Some(group) = group {
        node.reaper.tell("del", group);
    }
    let code = match &exit {
        Ok(status) => status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1),
        Err(_) => 1,
    };
    tracing::info!(pod = %id.name, namespace = %id.namespace, code, ?ending, "container ended");
    match ending {
        Ending::Gone => return,
        Ending::NodeLost => {
            node.api.remove(id).await;
            return;
        }
        Ending::OomKilled => {
            api.write_status(id, |pod| {
                status::terminated(pod, &launch.container, 137, "OOMKilled", "")
            })
            .await;
        }
        Ending::Evicted => {
            api.write_status(id, |pod| status::evicted(pod, &launch.container))
                .await
        }
        Ending::Exited => {
            let reason = if code == 0 { "Completed" } else { "Error" };
            api.write_status(id, |pod| {
                status::terminated(pod, &launch.container, code, reason, "")
            })
            .await;
        }
    }
    if terminating {
        node.api.remove(id).await;
    }
}

/// A pod that never starts waits for its delete, then goes at once.
async fn stay_pending(node: &Host, id: &PodId, orders: &mut mpsc::UnboundedReceiver<Order>) {
    loop {
        match orders.recv().await {
            Some(Order::Terminate(_)) => {
                node.api.remove(id).await;
                return;
            }
            Some(Order::Kill) | None => return,
            Some(Order::Fault(fault)) => {
                tracing::warn!(pod = %id.name, fault = fault.as_str(), "a pod that never started cannot play a fault");
            }
        }
    }
}

/// The search path a container gets when the kubelet has none (a Debian image's).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment every container starts with: the kubelet's `PATH` (or [`DEFAULT_PATH`])
/// and the variables `passed` names, each as the kubelet has it. A pod's process gets these,
/// `HOME` (its scratch directory), `HOSTNAME` (its name) and its own `env`: no credential or
/// setting of whoever started the kubelet leaks into a pod unless named.
fn base_environment(passed: &[String]) -> Vec<(String, String)> {
    let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_owned());
    let mut env = vec![("PATH".to_owned(), path)];
    for name in passed {
        match std::env::var(name) {
            Ok(value) if name != "PATH" => env.push((name.clone(), value)),
            Ok(_) => {}
            Err(_) => tracing::warn!(variable = %name, "a variable to pass to the pods is not set"),
        }
    }
    env
}

/// Starts the container's process in its own process group, its output in the pod's log.
fn spawn(node: &Host, id: &PodId, launch: &Launch) -> Result<tokio::process::Child, String> {
    let log = log_path(
        &node.root,
        &id.namespace,
        &id.name,
        &id.uid,
        &launch.container,
    );
    let dir = log
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| node.root.clone());
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let out =
        std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("opening {}: {e}", log.display()))?;
    let working_dir = launch
        .working_dir
        .as_ref()
        .map_or_else(|| dir.join("work"), PathBuf::from);
    std::fs::create_dir_all(&working_dir)
        .map_err(|e| format!("creating {}: {e}", working_dir.display()))?;
    let mut command = tokio::process::Command::new(&launch.program);
    command
        .args(&launch.args)
        .env_clear()
        .envs(node.base_env.iter().map(|(k, v)| (k, v)))
        .env("HOME", &dir)
        .env("HOSTNAME", &id.name)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&working_dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .kill_on_drop(true);
    command.spawn().map_err(|e| {
        format!(
            "failed to start container process: exec: {:?}: {e}",
            launch.program
        )
    })
}

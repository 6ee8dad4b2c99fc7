//! A real Airflow on the simulator: PostgreSQL restored from the cached `airflow db migrate`
//! dump, `podstream sim --kubelet` (worker pods run as local processes from the Airflow venv),
//! and Airflow's own components with the stock `KubernetesExecutor`: the scheduler for 2.x;
//! the api-server (whose execution API the 3.x workers call), dag-processor and scheduler
//! for 3.x. The DAGs are under `tests/airflow/dags`; callbacks leave marker files.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

use crate::airflow::Airflow;
use crate::postgres::PgCluster;
use crate::{free_port, kubectl, podstream_binary, workspace_root};

/// The database Airflow runs on.
const DATABASE: &str = "airflow";

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
        Service {
            name: name.to_owned(),
            child,
            log,
        }
    }

    fn group(&self) -> Option<Pid> {
        i32::try_from(self.child.id()).ok().map(Pid::from_raw)
    }

    /// Sends `signal` to the whole group.
    fn signal(&self, signal: Signal) {
        if let Some(group) = self.group() {
            let _ = killpg(group, signal);
        }
    }

    /// SIGTERM, up to 15 s to exit, then SIGKILL.
    fn stop(&mut self) {
        self.signal(Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.signal(Signal::SIGKILL);
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

/// A real Airflow with the stock KubernetesExecutor on `podstream sim --kubelet`.
pub struct RealAirflow {
    /// Which release.
    pub airflow: Airflow,
    /// The simulator's kubeconfig.
    pub kubeconfig: PathBuf,
    /// Where callbacks leave their markers.
    pub markers: PathBuf,
    pg: PgCluster,
    env: Vec<(String, String)>,
    sim: Option<Service>,
    components: Vec<Service>,
    dir: tempfile::TempDir,
}

impl RealAirflow {
    /// Starts PostgreSQL, the simulator with its kubelet, and Airflow's components.
    ///
    /// # Panics
    /// When anything fails to start: the test cannot go on without it.
    pub fn start(airflow: Airflow) -> RealAirflow {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let pg = PgCluster::start();
        pg.create_database(DATABASE, Some(&airflow.cached_pg_dump()));
        let kubeconfig = dir.path().join("kubeconfig");
        let markers = dir.path().join("markers");
        let home = dir.path().join("airflow-home");
        for folder in [&markers, &home] {
            std::fs::create_dir_all(folder).unwrap_or_else(|e| panic!("{e}"));
        }
        let env = environment(airflow, &pg, &kubeconfig, &markers, &home);
        let mut real = RealAirflow {
            airflow,
            kubeconfig,
            markers,
            pg,
            env,
            sim: None,
            components: Vec::new(),
            dir,
        };
        real.start_sim();
        for component in airflow.components() {
            real.start_component(component);
        }
        real
    }

    fn start_sim(&mut self) {
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

    /// Starts one Airflow component (`scheduler`, `api-server`, `dag-processor`).
    pub fn start_component(&mut self, component: &str) {
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
        let deadline = Instant::now() + timeout;
        loop {
            let rows = self.query(&format!(
                "SELECT state FROM dag_run WHERE dag_id = '{dag_id}' ORDER BY id LIMIT 1"
            ));
            if let Some(state) = rows.first().and_then(|r| r.first())
                && (state == "success" || state == "failed")
            {
                return state.clone();
            }
            assert!(
                Instant::now() < deadline,
                "the run of {dag_id} did not end in {timeout:?}; rows {rows:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
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

    /// The pods in the simulator now.
    pub fn pods(&self) -> Vec<Value> {
        let (ok, stdout, stderr) = kubectl(&self.kubeconfig, &["get", "pods", "-A", "-o", "json"]);
        assert!(ok, "kubectl get pods: {stderr}");
        serde_json::from_str::<Value>(&stdout)
            .ok()
            .and_then(|list| list["items"].as_array().cloned())
            .unwrap_or_default()
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

    /// The last lines of every process's log.
    pub fn logs(&self) -> String {
        self.sim
            .iter()
            .chain(&self.components)
            .map(|s| s.tail(30))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RealAirflow {
    fn drop(&mut self) {
        for component in self.components.iter_mut().rev() {
            component.stop();
        }
        if let Some(sim) = self.sim.as_mut() {
            sim.stop();
        }
    }
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

/// Airflow's settings for the tests, as `AIRFLOW__*` variables (the worker pods inherit them
/// from the simulator, as pods inherit a ConfigMap's): PostgreSQL, the KubernetesExecutor on
/// the simulator, short scheduler intervals, and for 3.x the execution API's address.
fn environment(
    airflow: Airflow,
    pg: &PgCluster,
    kubeconfig: &Path,
    markers: &Path,
    home: &Path,
) -> Vec<(String, String)> {
    let tests = workspace_root().join("tests/airflow");
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
            &tests.join("dags").display().to_string(),
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
        ("PODSTREAM_MARKERS", &markers.display().to_string()),
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
        ] {
            env.push((key.to_owned(), value));
        }
    }
    env
}

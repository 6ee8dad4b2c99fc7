//! docs/install.md run as written: each step's commands and files taken from the page and run
//! in order against real parts, ending with a real Airflow 3.1 scheduler whose task's pod is
//! killed and retried through podstream.
//!
//! - Step 1: a three-node nats-server cluster with the page's JetStream settings and its users
//!   include (the passwords in the environment), over TLS.
//! - Step 2: the page's SQL on PostgreSQL, the sink's role made with exactly those grants.
//! - Step 3: the page's `kubectl create secret` commands, run by bash in a directory holding the
//!   files they name, then `helm install` of the chart with the page's `podstream-values.yaml`,
//!   on a real kube-apiserver. Each Deployment the chart made then runs as a process, as its
//!   pod would: its arguments, its ConfigMap as environment, its Secrets as files, the ingest
//!   with its ServiceAccount's token.
//! - Step 4: the page's Airflow chart values as Airflow's settings (`config:` as `AIRFLOW__…`
//!   variables, the scheduler's Secrets as files).
//! - Step 5: `podstream check` of each component as the page runs it.
//!
//! What the test changes, and why: addresses (the page names cluster services, here every
//! server is on 127.0.0.1), where Secrets are mounted (under a directory of the test's, not
//! `/var/run/secrets`) and each NATS node's `store_dir` (its own directory). PostgreSQL is reached without TLS (the stage's server has none),
//! and each component's metrics listen on a port of their own (three processes share a host).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use podstream_tests::airflow::Airflow;
use podstream_tests::control_plane::{ControlPlane, tool};
use podstream_tests::nats::{NatsCluster, NodeConfig};
use podstream_tests::pki::Pki;
use podstream_tests::real_airflow::{Dags, Executor, Kubernetes, RealAirflow, TiRow};
use podstream_tests::{podstream_binary, workspace_root};
use serde_json::Value;

/// Where the pods of the page mount their Secrets.
const MOUNTS: &str = "/var/run/secrets/podstream";
/// The namespace the page installs into.
const NAMESPACE: &str = "airflow";
/// The users the page's users file defines, by the file holding each one's password.
const USERS: [&str; 7] = podstream_tests::nats::SHIPPED_USERS;

/// The page, its continuation lines joined.
fn page() -> String {
    std::fs::read_to_string(workspace_root().join("docs/install.md"))
        .unwrap()
        .replace("\\\n", " ")
}

/// The first fenced block after `marker` whose fence opens with `fence` (e.g. "```sql").
fn block_after(page: &str, marker: &str, fence: &str) -> String {
    let from = page
        .find(marker)
        .unwrap_or_else(|| panic!("install.md has no {marker:?}"));
    let rest = &page[from..];
    let start = rest
        .find(&format!("{fence}\n"))
        .unwrap_or_else(|| panic!("no {fence} block after {marker:?}"))
        + fence.len()
        + 1;
    let body = &rest[start..];
    body[..body.find("```").unwrap()].to_owned()
}

/// YAML as JSON, read by the PyYAML that comes with checkov (target/tools/deploy).
fn yaml(text: &str) -> Value {
    let python = workspace_root().join("target/tools/deploy/bin/python");
    let output = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin.read())))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(output.status.success(), "YAML: {text}");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A path the page names under [`MOUNTS`], under `root` instead.
fn mounted(root: &Path, text: &str) -> String {
    text.replace(
        MOUNTS,
        &root
            .join(MOUNTS.trim_start_matches('/'))
            .display()
            .to_string(),
    )
}

/// Secret `name`'s keys (`items`: only those, under their paths) as files in `dir`.
fn write_secret(plane: &ControlPlane, name: &str, items: Option<&Value>, dir: &Path) {
    let (ok, out, err) = plane.kubectl(&["get", "secret", name, "-n", NAMESPACE, "-o", "json"]);
    assert!(ok, "Secret {name}: {err}");
    let secret: Value = serde_json::from_str(&out).unwrap();
    let data = secret["data"].as_object().unwrap();
    let files: Vec<(String, String)> = match items.and_then(Value::as_array) {
        Some(items) => items
            .iter()
            .map(|i| {
                (
                    i["key"].as_str().unwrap().to_owned(),
                    i["path"].as_str().unwrap().to_owned(),
                )
            })
            .collect(),
        None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
    };
    std::fs::create_dir_all(dir).unwrap();
    for (key, path) in files {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data[&key].as_str().unwrap())
            .unwrap();
        std::fs::write(dir.join(path), bytes).unwrap();
    }
}

/// Airflow's settings from the page's chart values (`config:`), paths under `root`, NATS at
/// `nats`.
fn airflow_settings(values: &Value, root: &Path, nats: &str) -> Vec<(String, String)> {
    let mut settings = Vec::new();
    for (section, keys) in values["config"].as_object().unwrap() {
        for (key, value) in keys.as_object().unwrap() {
            let value = match (section.as_str(), key.as_str()) {
                ("podstream", "url") => nats.to_owned(),
                _ => mounted(root, value.as_str().unwrap()),
            };
            settings.push((
                format!(
                    "AIRFLOW__{}__{}",
                    section.to_uppercase(),
                    key.to_uppercase()
                ),
                value,
            ));
        }
    }
    settings
}

#[test]
fn the_install_page_runs_as_written() {
    let page = page();
    let root = tempfile::tempdir().unwrap();
    let operator = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let mut passwords = BTreeMap::new();
    for user in USERS {
        let password = format!("{user}-{}", std::process::id());
        std::fs::write(operator.path().join(format!("{user}.pw")), &password).unwrap();
        passwords.insert(user, password);
    }
    let db_password = format!("db-{}", std::process::id());
    std::fs::write(operator.path().join("db.pw"), &db_password).unwrap();
    std::fs::copy(pki.path("ca.pem"), operator.path().join("ca.pem")).unwrap();

    // Step 1: NATS, as the page configures it.
    let nats_config = block_after(&page, "## 1. NATS", "```");
    assert!(
        nats_config.contains("sync_interval: always"),
        "{nats_config}"
    );
    // Each node's own storage, where the page has the chart's volume.
    let nats_config = nats_config.replace(
        "store_dir: /data/jetstream",
        &format!("store_dir: ${}", podstream_tests::nats::STORE_DIR_VARIABLE),
    );
    assert!(nats_config.contains("store_dir: $"), "{nats_config}");
    let cluster = NatsCluster::start_configured(
        3,
        &NodeConfig {
            text: Some(nats_config),
            files: vec![(
                "podstream-users.conf".to_owned(),
                workspace_root().join("deploy/nats/podstream-users.conf"),
            )],
            args: vec![
                "--tls".to_owned(),
                "--tlscert".to_owned(),
                pki.path("server.pem").display().to_string(),
                "--tlskey".to_owned(),
                pki.path("server-key.pem").display().to_string(),
            ],
            env: passwords
                .iter()
                .map(|(user, password)| {
                    (
                        format!("PODSTREAM_{}_PASSWORD", user.to_uppercase()),
                        password.clone(),
                    )
                })
                .collect(),
        },
    );
    let nats = cluster.urls().replace("nats://", "tls://");

    // Step 4's settings first: the stage gives them to Airflow and to its worker pods.
    let airflow_values = yaml(&block_after(&page, "Then the chart's values", "```yaml"));
    // Every pod has its own filesystem: the scheduler's Secrets under `scheduler/`.
    let scheduler_root = root.path().join("scheduler");
    let settings = airflow_settings(&airflow_values, &scheduler_root, &nats);
    let mut real = RealAirflow::set_up_with(
        Airflow::line("3.1"),
        Dags::Failures,
        Executor::Installed,
        Kubernetes::Real,
        settings,
    );
    let kubeconfig = real.kubeconfig.clone();

    // Step 2: the sink's role, as the page's SQL makes it.
    let statements: Vec<String> = podstream_tests::install_page_sql()
        .into_iter()
        .map(|s| s.replace("PASSWORD '...'", &format!("PASSWORD '{db_password}'")))
        .collect();
    assert!(statements.len() >= 6, "{statements:?}");
    for statement in &statements {
        real.query(statement);
    }

    // Step 3: the Secrets, by the page's own commands, then the chart.
    // The image is built and pushed first (the stage runs the binary itself).
    let steps = block_after(&page, "Create the Secrets the components mount", "```sh");
    let kubectl_dir = tool("kubectl").parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut installed = false;
    for command in steps.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let command = command.trim();
        if command.is_empty() {
            continue;
        }
        if command.starts_with("helm install") {
            installed = true;
            let values = operator.path().join("podstream-values.yaml");
            std::fs::write(
                &values,
                block_after(&page, "with `podstream-values.yaml`", "```yaml"),
            )
            .unwrap();
            let overrides = operator.path().join("addresses.yaml");
            let db = real.database_url().replacen(
                &format!("postgres:{}", real_password(&real)),
                "podstream",
                1,
            );
            std::fs::write(
                &overrides,
                format!(
                    "nats:\n  url: {nats:?}\ndatabase:\n  url: {db:?}\nmonitoring:\n  podMonitor:\n    enabled: false\n  prometheusRule:\n    enabled: false\n"
                ),
            )
            .unwrap();
            let chart = workspace_root().join("deploy/chart").display().to_string();
            let helm = Command::new(tool("helm"))
                .args(command.split_whitespace().skip(1).map(|a| {
                    if a == "deploy/chart" {
                        chart.as_str()
                    } else {
                        a
                    }
                }))
                .arg("--values")
                .arg(&overrides)
                .current_dir(operator.path())
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .unwrap();
            assert!(
                helm.status.success(),
                "{command}: {}",
                String::from_utf8_lossy(&helm.stderr)
            );
            continue;
        }
        assert!(
            command.starts_with("kubectl -n airflow create secret"),
            "a step of the page this test does not know: {command}"
        );
        let ran = Command::new("bash")
            .args(["-c", command])
            .current_dir(operator.path())
            .env("PATH", &path)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap();
        assert!(
            ran.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&ran.stderr)
        );
    }
    assert!(installed, "the page's step 3 installs the chart");

    // The install's pods, as processes, and the scheduler's Secrets where step 4 mounts them.
    let (pods, commands) = {
        let plane = real.control_plane().unwrap();
        let pods = deployments(plane);
        let commands: Vec<(String, Command)> = pods
            .iter()
            .map(|deployment| {
                let (name, mut command, args) = pod_as_process(plane, deployment, root.path());
                command.args(args);
                (name, command)
            })
            .collect();
        let scheduler = &airflow_values["scheduler"];
        for mount in scheduler["extraVolumeMounts"].as_array().unwrap() {
            let volume = scheduler["extraVolumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap();
            let dir = PathBuf::from(mounted(
                &scheduler_root,
                mount["mountPath"].as_str().unwrap(),
            ));
            write_secret(
                plane,
                volume["secret"]["secretName"].as_str().unwrap(),
                None,
                &dir,
            );
        }
        (pods, commands)
    };
    for (name, command) in commands {
        real.start_process(&name, command);
    }
    real.start_components();

    // The story: a task whose pod is killed, retried once, failed again.
    let state = real.wait_for_run("podstream_failures", Duration::from_secs(300));
    assert_eq!(state, "failed", "{}", real.logs());
    assert_eq!(
        real.tis("podstream_failures"),
        [TiRow {
            task_id: "killed".to_owned(),
            state: "failed".to_owned(),
            try_number: 2
        }],
        "{}",
        real.logs()
    );
    let log = real.logs_of("scheduler").join("\n");
    assert!(
        log.contains("enters the executor as failed"),
        "the failure came from podstream\n{log}"
    );

    // The collector ran as its pod would: under its own NATS user it took every command.
    let (last, delivered) = collector_progress(&nats, &passwords["collect"], &pki);
    assert!(
        last > 0 && delivered == last,
        "the collector took {delivered} of {last} commands\n{}",
        real.logs_of("podstream-collect").join("\n")
    );

    // Step 5: each component's check, as the page runs it in its pod.
    let plane = real.control_plane().unwrap();
    for line in page.lines() {
        let Some((_, args)) = line.split_once(" -- podstream check ") else {
            continue;
        };
        let pod_root = root.path().join(format!(
            "podstream-{}",
            args.split_whitespace().next().unwrap()
        ));
        let args: Vec<String> = args
            .split_whitespace()
            .map(|a| mounted(&pod_root, a))
            .collect();
        let component = args[0].clone();
        let deployment = pods
            .iter()
            .find(|d| d["metadata"]["name"] == format!("podstream-{component}"))
            .unwrap();
        let (_, mut command, _) = pod_as_process(plane, deployment, root.path());
        let check = command.arg("check").args(&args).output().unwrap();
        let report = String::from_utf8_lossy(&check.stdout);
        assert!(
            check.status.success(),
            "podstream check {component}:\n{report}{}",
            String::from_utf8_lossy(&check.stderr)
        );
        assert!(report.contains("3 replica(s)"), "{report}");
    }
}

/// The commands stream's last sequence and the last the collector's consumer was given, once
/// it has been given them all or 30 s passed: asked as the collector's user over TLS.
fn collector_progress(nats: &str, password: &str, pki: &Pki) -> (u64, u64) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = async_nats::ConnectOptions::with_user_and_password(
            "podstream-collect".to_owned(),
            password.to_owned(),
        )
        .add_root_certificates(pki.path("ca.pem"))
        .require_tls(true)
        .custom_inbox_prefix("_INBOX_podstream-collect")
        .connect(
            nats.split(',')
                .map(|url| url.parse::<async_nats::ServerAddr>().unwrap())
                .collect::<Vec<_>>()
                .as_slice(),
        )
        .await
        .unwrap();
        let js = async_nats::jetstream::new(client);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut stream = js.get_stream("PODSTREAM_COMMANDS").await.unwrap();
            let last = stream.info().await.unwrap().state.last_sequence;
            let info = stream.consumer_info("podstream-collect").await.unwrap();
            let delivered = info.delivered.stream_sequence;
            if (last > 0 && delivered == last) || std::time::Instant::now() > deadline {
                return (last, delivered);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// The stage's PostgreSQL superuser's password, from its URL.
fn real_password(real: &RealAirflow) -> String {
    let url = real.database_url();
    let credentials = url
        .trim_start_matches("postgres://")
        .split('@')
        .next()
        .unwrap();
    credentials.split_once(':').unwrap().1.to_owned()
}

/// The Deployments the chart made.
fn deployments(plane: &ControlPlane) -> Vec<Value> {
    let (ok, out, err) = plane.kubectl(&[
        "get",
        "deployments",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/instance=podstream",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let items = list["items"].as_array().unwrap().clone();
    // ingest, process, sink and the collector.
    assert_eq!(items.len(), 4, "{out}");
    items
}

/// A Deployment's pod as a process: its name, `podstream` with its ConfigMap as environment,
/// its Secrets as files under `<root>/<its name>` (its own filesystem) and its
/// ServiceAccount's token when it mounts one, and the container's arguments (for the caller
/// to add, or others instead).
fn pod_as_process(
    plane: &ControlPlane,
    deployment: &Value,
    root: &Path,
) -> (String, Command, Vec<String>) {
    let name = deployment["metadata"]["name"].as_str().unwrap().to_owned();
    let root = &root.join(&name);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mut command = Command::new(podstream_binary());
    for from in container["envFrom"].as_array().into_iter().flatten() {
        let map = from["configMapRef"]["name"].as_str().unwrap();
        let (ok, out, err) =
            plane.kubectl(&["get", "configmap", map, "-n", NAMESPACE, "-o", "json"]);
        assert!(ok, "{err}");
        let config: Value = serde_json::from_str(&out).unwrap();
        for (key, value) in config["data"].as_object().unwrap() {
            command.env(key, mounted(root, value.as_str().unwrap()));
        }
    }
    command
        .env("PODSTREAM_METRICS_LISTEN", "127.0.0.1:0")
        .env("POD_NAME", format!("{name}-0"))
        .env("POD_NAMESPACE", NAMESPACE)
        .env("PODSTREAM_LOG", "info");
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        let dir = PathBuf::from(mounted(root, mount["mountPath"].as_str().unwrap()));
        write_secret(
            plane,
            volume["secret"]["secretName"].as_str().unwrap(),
            Some(&volume["secret"]["items"]),
            &dir,
        );
    }
    let account = pod["serviceAccountName"].as_str().unwrap();
    if pod["automountServiceAccountToken"] != false {
        command.env(
            "KUBECONFIG",
            plane.service_account_kubeconfig(NAMESPACE, account),
        );
    }
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| mounted(root, a.as_str().unwrap()).replace("$(POD_NAMESPACE)", NAMESPACE))
        .collect();
    (name, command, args)
}

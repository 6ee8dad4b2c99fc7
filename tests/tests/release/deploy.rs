//! `deploy/`, checked offline: each overlay renders with `kubectl kustomize`, passes
//! `kubernetes-validate --strict` for Kubernetes 1.32 and `checkov` with no failed check
//! (each waiver carries its reason in the manifest), and holds what this project promises:
//! flags the binary takes, non-root read-only containers with probes and limits, RBAC
//! without wildcards, the overlay's `--task-failures`, and NATS users that
//! `deploy/nats/podstream-users.conf` defines. The image recipe passes checkov too.

use std::path::{Path, PathBuf};
use std::process::Command;

use podstream_tests::{podstream_binary, workspace_root};
use serde_json::Value;

const OVERLAYS: [(&str, &str); 2] = [
    ("stock-executor", "--task-failures=sink"),
    ("podstream-executor", "--task-failures=executor"),
];

/// A checker installed by scripts/setup.sh under target/tools/deploy.
fn tool(name: &str) -> PathBuf {
    let path = workspace_root().join("target/tools/deploy/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup.sh",
        path.display()
    );
    path
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The overlay rendered: its YAML in a file of its own dir, and its objects.
fn render(overlay: &str, dir: &Path) -> (PathBuf, Vec<Value>) {
    let yaml = run(
        Command::new(podstream_stage::control_plane::tool("kubectl"))
            .arg("kustomize")
            .arg(workspace_root().join("deploy/overlays").join(overlay)),
    );
    let file = dir.join(format!("{overlay}.yaml"));
    std::fs::write(&file, &yaml).unwrap();
    // PyYAML comes with checkov: the rendered documents as JSON.
    let json = run(Command::new(tool("python")).args([
        "-c",
        "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        &file.display().to_string(),
    ]));
    let objects: Vec<Value> = serde_json::from_str(&json).unwrap();
    (file, objects)
}

/// `podstream <args>` parses: clap refuses an unknown flag or value before `--help`.
fn assert_parses(args: &[&str]) {
    let parsed = Command::new(podstream_binary())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn every_overlay_renders_validates_and_keeps_the_promises() {
    let users =
        std::fs::read_to_string(workspace_root().join("deploy/nats/podstream-users.conf")).unwrap();
    for (overlay, task_failures) in OVERLAYS {
        // Not under a dot-named dir (tempdir()'s default): checkov skips hidden paths.
        let dir = tempfile::Builder::new()
            .prefix("podstream-deploy-")
            .tempdir()
            .unwrap();
        let (file, objects) = render(overlay, dir.path());

        validate_and_check(&file, dir.path());

        let deployments = of_kind(&objects, "Deployment");
        let names: Vec<&str> = deployments
            .iter()
            .filter_map(|d| d["metadata"]["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["podstream-ingest", "podstream-process", "podstream-sink"]
        );
        for deployment in &deployments {
            let name = deployment["metadata"]["name"].as_str().unwrap();
            let pod = &deployment["spec"]["template"]["spec"];
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
            let containers = pod["containers"].as_array().unwrap();
            assert_eq!(containers.len(), 1, "{name}");
            let container = &containers[0];
            let security = &container["securityContext"];
            assert_eq!(security["readOnlyRootFilesystem"], true, "{name}");
            assert_eq!(security["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(
                strings(&security["capabilities"]["drop"]),
                ["ALL"],
                "{name}"
            );
            assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
            assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
            assert!(
                container["resources"]["limits"]["memory"].is_string(),
                "{name}"
            );

            // Every flag is one the binary takes (clap refuses an unknown one before --help).
            let args = strings(&container["args"]);
            assert_parses(&args);
            // Its NATS user is one the shipped server config defines.
            let user = args
                .iter()
                .find_map(|a| a.strip_prefix("--nats-user="))
                .unwrap_or_else(|| panic!("{name} logs in to NATS"));
            assert!(users.contains(&format!("user: {user}\n")), "{name}: {user}");
            assert!(
                !args
                    .iter()
                    .any(|a| a.contains("password=") && !a.contains("-file=")),
                "{name}: a secret in its args"
            );
        }
        let replicas = |name: &str| {
            deployments
                .iter()
                .find(|d| d["metadata"]["name"] == name)
                .map(|d| d["spec"]["replicas"].clone())
        };
        assert_eq!(replicas("podstream-ingest"), Some(Value::from(2)));
        // The shared settings: each a variable the components read, and streams and buckets
        // made with three replicas, so one lost NATS node loses no checkpoint or command.
        let settings = of_kind(&objects, "ConfigMap")
            .into_iter()
            .find(|c| c["data"]["PODSTREAM_NATS"].is_string())
            .unwrap_or_else(|| panic!("{overlay}: no ConfigMap of podstream's settings"));
        assert_eq!(
            settings["data"]["PODSTREAM_STREAM_REPLICAS"], "3",
            "{overlay}"
        );
        let helps: String = [
            &["--help"][..],
            &["ingest", "--help"],
            &["process", "--help"],
            &["sink", "--help"],
        ]
        .iter()
        .map(|args| run(Command::new(podstream_binary()).args(*args)))
        .collect();
        for key in settings["data"].as_object().unwrap().keys() {
            assert!(
                // `[env: KEY=]`, `[env: KEY]` for a value --help hides, or named in a flag's
                // help (`PODSTREAM_LOG`, read by the log filter).
                helps.contains(&format!("[env: {key}="))
                    || helps.contains(&format!("[env: {key}]"))
                    || helps.contains(&format!("`{key}`")),
                "{overlay}: no component reads {key}"
            );
        }
        let process = deployments
            .iter()
            .find(|d| d["metadata"]["name"] == "podstream-process")
            .unwrap();
        let process_args = strings(&process["spec"]["template"]["spec"]["containers"][0]["args"]);
        assert_eq!(
            process_args.contains(&"--require-signed-pods"),
            overlay == "podstream-executor",
            "{overlay}: only the executor's pods are signed: {process_args:?}"
        );
        let sink = deployments
            .iter()
            .find(|d| d["metadata"]["name"] == "podstream-sink")
            .unwrap();
        let sink_args = strings(&sink["spec"]["template"]["spec"]["containers"][0]["args"]);
        assert!(
            sink_args.contains(&task_failures),
            "{overlay}: {sink_args:?}"
        );

        // RBAC: no wildcard anywhere; on pods, only list and watch.
        for role in of_kind(&objects, "Role")
            .into_iter()
            .chain(of_kind(&objects, "ClusterRole"))
        {
            for rule in role["rules"].as_array().unwrap() {
                for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                    assert!(!strings(&rule[field]).contains(&"*"), "{role}");
                }
                if strings(&rule["resources"]).contains(&"pods") {
                    assert_eq!(strings(&rule["verbs"]), ["list", "watch"]);
                }
            }
        }
        for kind in ["PodDisruptionBudget", "NetworkPolicy", "ServiceAccount"] {
            assert!(!of_kind(&objects, kind).is_empty(), "{overlay}: no {kind}");
        }
    }
}

#[test]
fn the_image_recipe_passes_checkov() {
    let report = run(Command::new(tool("checkov"))
        .args([
            "--framework",
            "dockerfile",
            "--compact",
            "--quiet",
            "--skip-download",
            "-f",
        ])
        .arg(workspace_root().join("deploy/Dockerfile")));
    assert_clean(&report);
}

/// The rendered `file` validates against Kubernetes 1.32's schemas, strictly, and checkov finds
/// nothing in `scanned` (the file, or its dir).
fn validate_and_check(file: &Path, scanned: &Path) {
    run(Command::new(tool("kubernetes-validate"))
        .args(["--strict", "--quiet", "-k", "1.32.0"])
        .arg(file));
    let scope = if scanned.is_dir() { "-d" } else { "-f" };
    let report = run(Command::new(tool("checkov"))
        .args([
            "--framework",
            "kubernetes",
            "--compact",
            "--quiet",
            "--skip-download",
            scope,
        ])
        .arg(scanned));
    assert_clean(&report);
}

/// checkov's report says it ran checks, and none failed.
fn assert_clean(report: &str) {
    let count = |label: &str| -> usize {
        report
            .split(label)
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {label:?} in checkov's report: {report}"))
    };
    assert!(count("Passed checks: ") > 0, "{report}");
    assert_eq!(count("Failed checks: "), 0, "{report}");
}

/// Every metric the dashboard queries is one podstream exports, every exported metric is on
/// it, and the reference documents each.
#[test]
fn the_dashboard_and_the_reference_show_exactly_the_exported_metrics() {
    use podstream_bus::metrics::ALL;
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("deploy/grafana/podstream.json")).unwrap(),
    )
    .unwrap();
    // One install at a time: a namespace variable, and every series selected by it.
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "namespace" && v["type"] == "query"),
        "no namespace variable: {variables:?}"
    );
    let mut queried = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let series = expr.matches("podstream_").count();
            let scoped = expr.matches("{namespace=\"$namespace\"").count();
            assert_eq!(series, scoped, "not every series by $namespace: {expr}");
            for (at, _) in expr.match_indices("podstream_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(&name)
                    .to_owned();
                assert!(ALL.contains(&base.as_str()), "{base} is not exported");
                queried.insert(base);
            }
        }
    }
    let exported: std::collections::BTreeSet<String> =
        ALL.iter().map(|m| (*m).to_owned()).collect();
    assert_eq!(queried, exported, "the dashboard leaves out some");
    let reference = std::fs::read_to_string(workspace_root().join("docs/reference.md")).unwrap();
    for metric in ALL {
        assert!(
            reference.contains(&format!("`{metric}`")),
            "{metric} undocumented"
        );
    }
}

/// YAML (any number of documents) as JSON values, read by the PyYAML that comes with checkov.
fn yaml_documents(file: &Path) -> Vec<Value> {
    let json = run(Command::new(tool("python")).args([
        "-c",
        "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        &file.display().to_string(),
    ]));
    serde_json::from_str(&json).unwrap()
}

/// GitHub's anchor of a Markdown heading: lower case, spaces as dashes, punctuation gone.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// deploy/monitoring, the optional component: an overlay that takes it renders a PodMonitor
/// that finds every podstream pod's metrics port and a PrometheusRule whose alerts pass
/// `promtool check rules`; `promtool test rules` (rules-test.yaml) shows each alert firing on
/// trouble and quiet otherwise; each alert has a firing case and a runbook entry that exists.
#[test]
fn the_monitoring_component_scrapes_every_pod_and_its_alerts_fire_on_trouble() {
    let root = workspace_root();
    let (_overlay, objects) = with_monitoring("stock-executor");

    let monitors = of_kind(&objects, "PodMonitor");
    assert_eq!(monitors.len(), 1);
    let monitor = monitors[0];
    assert_eq!(monitor["metadata"]["namespace"], "airflow");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .unwrap();
    let deployments = of_kind(&objects, "Deployment");
    assert_eq!(deployments.len(), 3);
    for deployment in deployments {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let template = &deployment["spec"]["template"];
        for (key, value) in selector {
            assert_eq!(
                &template["metadata"]["labels"][key], value,
                "{name}: the PodMonitor does not select its pods"
            );
        }
        let ports = template["spec"]["containers"][0]["ports"]
            .as_array()
            .unwrap();
        assert!(
            ports.iter().any(|p| p["name"] == port),
            "{name}: no port {port}"
        );
    }

    let rules = of_kind(&objects, "PrometheusRule");
    assert_eq!(rules.len(), 1);
    let groups = &rules[0]["spec"];
    let dir = tempfile::Builder::new()
        .prefix("podstream-rules-")
        .tempdir()
        .unwrap();
    std::fs::write(
        dir.path().join("podstream-rules.json"),
        serde_json::to_string(groups).unwrap(),
    )
    .unwrap();
    let tests_file = dir.path().join("rules-test.yaml");
    std::fs::copy(root.join("deploy/monitoring/rules-test.yaml"), &tests_file).unwrap();
    if let Err(e) = Command::new("promtool").arg("--version").output() {
        panic!("promtool: {e} (scripts/setup.sh installs Debian's prometheus)");
    }
    let promtool = |args: &[&str]| run(Command::new("promtool").args(args).current_dir(dir.path()));
    promtool(&["check", "rules", "podstream-rules.json"]);
    promtool(&["test", "rules", "rules-test.yaml"]);

    // Every alert is proven to fire somewhere, and links an entry of the runbook.
    let tests = yaml_documents(&tests_file);
    let firing: std::collections::BTreeSet<&str> = tests[0]["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|test| test["alert_rule_test"].as_array().unwrap())
        .filter(|case| !case["exp_alerts"].as_array().unwrap().is_empty())
        .filter_map(|case| case["alertname"].as_str())
        .collect();
    let operations = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let anchors: Vec<String> = operations
        .lines()
        .filter_map(|line| line.strip_prefix('#'))
        .map(|heading| anchor(heading.trim_start_matches('#')))
        .collect();
    for rule in groups["groups"][0]["rules"].as_array().unwrap() {
        let alert = rule["alert"].as_str().unwrap();
        assert!(firing.contains(alert), "{alert} is never shown firing");
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap();
        let (page, entry) = runbook.split_once('#').unwrap();
        assert_eq!(page, "docs/operations.md", "{alert}");
        assert!(
            anchors.iter().any(|a| a == entry),
            "{alert}: no heading for #{entry} in docs/operations.md"
        );
    }
}

/// `overlay` with the deploy/monitoring component, as an operator's own overlay takes it:
/// its dir and its objects.
fn with_monitoring(overlay: &str) -> (tempfile::TempDir, Vec<Value>) {
    with_components(overlay, &["monitoring"], "")
}

/// `overlay` with the components of deploy/ named and `extra` lines, as an operator's own
/// overlay takes them: its dir ([`podstream_tests::overlay_dir`]) with the rendered YAML
/// in `rendered.yaml`, and its objects.
fn with_components(
    overlay: &str,
    components: &[&str],
    extra: &str,
) -> (tempfile::TempDir, Vec<Value>) {
    let dir = podstream_tests::overlay_dir("podstream-components-");
    let listed: String = components
        .iter()
        .map(|c| format!("  - ../../deploy/{c}\n"))
        .collect();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!("resources:\n  - ../../deploy/overlays/{overlay}\ncomponents:\n{listed}{extra}"),
    )
    .unwrap();
    let yaml = run(
        Command::new(podstream_stage::control_plane::tool("kubectl"))
            .arg("kustomize")
            .arg(dir.path()),
    );
    let rendered = dir.path().join("rendered.yaml");
    std::fs::write(&rendered, yaml).unwrap();
    let objects = yaml_documents(&rendered);
    (dir, objects)
}

/// deploy/collector, the optional component: with either overlay it adds one Deployment that
/// validates, passes checkov, runs `collect` with flags the binary takes and a NATS user the
/// shipped users file defines, and a Role that may delete pods and nothing else; the base's
/// objects stay as they were, and every Deployment takes an image set as the page sets it.
#[test]
fn the_collector_component_may_delete_pods_and_nothing_else() {
    let users =
        std::fs::read_to_string(workspace_root().join("deploy/nats/podstream-users.conf")).unwrap();
    // docs/install.md's `kustomize edit set image <name>=<image>`, as an overlay's entry.
    let page = std::fs::read_to_string(workspace_root().join("docs/install.md")).unwrap();
    let (name, image) = page
        .lines()
        .find_map(|l| l.trim().strip_prefix("kustomize edit set image "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|pair| pair.split_once('='))
        .expect("install.md sets the image with kustomize edit");
    let (new_name, new_tag) = image.rsplit_once(':').unwrap();
    let images =
        format!("images:\n  - name: {name}\n    newName: {new_name}\n    newTag: \"{new_tag}\"\n");
    for overlay in ["podstream-executor", "stock-executor"] {
        let (dir, objects) = with_components(overlay, &["collector"], &images);
        let rendered = dir.path().join("rendered.yaml");
        validate_and_check(&rendered, &rendered);

        // The overlay's own objects are as they were (the pod defaults, applied again to
        // them, change nothing).
        let before = by_name(&render(overlay, dir.path()).1);
        let after = by_name(&objects);
        for (key, object) in &before {
            let mut object = object.clone();
            if key.0 == "Deployment" {
                object["spec"]["template"]["spec"]["containers"][0]["image"] = Value::from(image);
            }
            assert_eq!(after.get(key), Some(&object), "{overlay}: {key:?} changed");
        }
        let added: Vec<&(String, String)> =
            after.keys().filter(|k| !before.contains_key(*k)).collect();
        assert_eq!(
            added,
            [
                ("Deployment", "podstream-collect"),
                ("NetworkPolicy", "podstream-collect-api"),
                ("PodDisruptionBudget", "podstream-collect"),
                ("Role", "podstream-collect"),
                ("RoleBinding", "podstream-collect"),
                ("ServiceAccount", "podstream-collect"),
            ]
            .iter()
            .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>(),
            "{overlay}"
        );
        for ((_, name), object) in after.iter().filter(|(k, _)| !before.contains_key(*k)) {
            assert_eq!(object["metadata"]["namespace"], "airflow", "{name}");
        }

        let collect = &after[&("Deployment".to_owned(), "podstream-collect".to_owned())];
        let pod = &collect["spec"]["template"]["spec"];
        let process = &after[&("Deployment".to_owned(), "podstream-process".to_owned())]["spec"]["template"]
            ["spec"];
        // The pod defaults reached it: the same security, probes and resources as the others.
        for field in ["securityContext", "terminationGracePeriodSeconds"] {
            assert_eq!(pod[field], process[field], "{field}");
        }
        let container = &pod["containers"][0];
        let theirs = &process["containers"][0];
        for field in [
            "securityContext",
            "livenessProbe",
            "readinessProbe",
            "resources",
            "envFrom",
            "image",
        ] {
            assert_eq!(container[field], theirs[field], "{field}");
        }
        let args = strings(&container["args"]);
        assert_eq!(args[0], "collect");
        assert_parses(&args);
        assert!(users.contains("user: podstream-collect\n"));
        assert!(args.contains(&"--nats-user=podstream-collect"), "{args:?}");

        let role = &after[&("Role".to_owned(), "podstream-collect".to_owned())];
        assert_eq!(
            role["rules"],
            serde_json::json!([{ "apiGroups": [""], "resources": ["pods"], "verbs": ["delete"] }])
        );
        let binding = &after[&("RoleBinding".to_owned(), "podstream-collect".to_owned())];
        assert_eq!(binding["subjects"][0]["namespace"], "airflow");
        assert_eq!(binding["roleRef"]["name"], "podstream-collect");
    }
}

/// `helm template` of deploy/chart as release `release` in namespace `airflow`, with a values
/// file and `values` (`--set` pairs): its objects, or Helm's refusal.
fn helm_template(
    release: &str,
    file: Option<&Path>,
    values: &[&str],
) -> Result<Vec<Value>, String> {
    let dir = tempfile::tempdir().unwrap();
    let mut helm = Command::new(podstream_stage::control_plane::tool("helm"));
    helm.args(["template", release])
        .arg(workspace_root().join("deploy/chart"))
        .args(["--namespace", "airflow"]);
    if let Some(file) = file {
        helm.arg("--values").arg(file);
    }
    for value in values {
        helm.args(["--set", value]);
    }
    let output = helm.output().unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let rendered = dir.path().join("chart.yaml");
    std::fs::write(&rendered, &output.stdout).unwrap();
    Ok(yaml_documents(&rendered)
        .into_iter()
        .filter(|o| !o.is_null())
        .collect())
}

/// What only the chart's objects carry: Helm's own labels (who installed them, which chart
/// and release) and checkov's waivers (they name where the image is set). Everything else of
/// an object must be the overlay's.
fn without_chart_marks(value: &Value) -> Value {
    const CHART_ONLY: [&str; 4] = [
        "helm.sh/chart",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
    ];
    match value {
        Value::Object(fields) => {
            let kept: serde_json::Map<String, Value> = fields
                .iter()
                .filter(|(k, _)| !CHART_ONLY.contains(&k.as_str()) && !k.starts_with("checkov.io/"))
                .map(|(k, v)| (k.clone(), without_chart_marks(v)))
                .filter(|(k, v)| {
                    !(k == "annotations" && v.as_object().is_some_and(|a| a.is_empty()))
                })
                .collect();
            Value::Object(kept)
        }
        Value::Array(items) => Value::Array(items.iter().map(without_chart_marks).collect()),
        other => other.clone(),
    }
}

/// Objects by kind and name.
fn by_name(objects: &[Value]) -> std::collections::BTreeMap<(String, String), Value> {
    objects
        .iter()
        .map(|o| {
            let key = (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            (key, without_chart_marks(o))
        })
        .collect()
}

/// deploy/chart passes `helm lint --strict`, and installed as `podstream` with an overlay's
/// settings it makes that overlay's objects, field for field (the monitoring and collector
/// components' included, with the overlay's relative runbook links): every check of the overlays in this
/// file holds for the chart. Its chart and app version are the workspace's.
#[test]
fn the_chart_lints_and_makes_each_overlays_objects() {
    run(Command::new(podstream_stage::control_plane::tool("helm"))
        .args(["lint", "--strict"])
        .arg(workspace_root().join("deploy/chart")));
    let chart = std::fs::read_to_string(workspace_root().join("deploy/chart/Chart.yaml")).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        chart.contains(&format!("\nversion: {version}\n")),
        "{chart}"
    );
    assert!(
        chart.contains(&format!("\nappVersion: \"{version}\"\n")),
        "{chart}"
    );

    let (_dir, executor) = with_components("podstream-executor", &["monitoring", "collector"], "");
    let monitored = [
        "monitoring.podMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.runbookUrl=docs/operations.md",
        "collector.enabled=true",
    ];
    let stock = render("stock-executor", tempfile::tempdir().unwrap().path()).1;
    for (overlay, objects, values) in [
        (
            "podstream-executor + monitoring + collector",
            executor,
            &monitored[..],
        ),
        ("stock-executor", stock, &["taskFailures=sink"][..]),
    ] {
        let from_chart = by_name(&helm_template("podstream", None, values).unwrap());
        let from_overlay = by_name(&objects);
        assert_eq!(
            from_chart.keys().collect::<Vec<_>>(),
            from_overlay.keys().collect::<Vec<_>>(),
            "{overlay}: the chart makes other objects"
        );
        for (key, object) in &from_overlay {
            assert_eq!(
                &from_chart[key], object,
                "{overlay}: {key:?} differs from the chart's"
            );
        }
    }
}

/// The chart's values do what values.yaml says: a second install's prefix names its Lease in
/// the Role, other namespaces get their own pods Role, a digest pins the image, spread
/// and monitoring labels are the operator's, runbook links are absolute; a value outside the
/// schema is refused.
#[test]
fn the_chart_follows_its_values() {
    let objects = helm_template(
        "airflow-b",
        None,
        &[
            "prefix=airflow-b",
            "podSelector=release=airflow-b",
            "namespaces={airflow,team-b}",
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "topologySpread=null",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.prometheusRule.labels.release=kube-prometheus",
            "monitoring.runbookUrl=https://runbooks.example/podstream.md",
            "secrets.natsClientCertificate=podstream-nats-client",
        ],
    )
    .unwrap();
    let deployments = of_kind(&objects, "Deployment");
    let names: Vec<&str> = deployments
        .iter()
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "airflow-b-podstream-ingest",
            "airflow-b-podstream-process",
            "airflow-b-podstream-sink"
        ]
    );
    for deployment in &deployments {
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["image"],
            "ghcr.io/podstream/podstream@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        );
        assert!(pod["topologySpreadConstraints"].is_null(), "{pod}");
        // Two installs in one namespace: each selects its own pods.
        assert_eq!(
            deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
            "airflow-b"
        );
    }
    let settings = &of_kind(&objects, "ConfigMap")[0]["data"];
    assert_eq!(settings["PODSTREAM_PREFIX"], "airflow-b");
    // Mutual TLS: each component presents the Secret's certificate, mounted where the
    // settings say.
    for deployment in &deployments {
        let pod = &deployment["spec"]["template"]["spec"];
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["secret"]["secretName"] == "podstream-nats-client")
            .expect("the client certificate's volume");
        let mount = pod["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume["name"])
            .expect("its mount");
        let dir = mount["mountPath"].as_str().unwrap();
        assert_eq!(
            settings["PODSTREAM_NATS_CERT"],
            format!("{dir}/tls.crt").as_str()
        );
        assert_eq!(
            settings["PODSTREAM_NATS_KEY"],
            format!("{dir}/tls.key").as_str()
        );
    }
    assert_eq!(settings["PODSTREAM_POD_SELECTOR"], "release=airflow-b");
    let ingest_args = strings(&deployments[0]["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        ingest_args.contains(&"--namespaces=airflow,team-b"),
        "{ingest_args:?}"
    );

    let roles = of_kind(&objects, "Role");
    let home = roles
        .iter()
        .find(|r| r["metadata"]["namespace"] == "airflow")
        .unwrap();
    let lease_names: Vec<&str> = home["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| strings(&rule["resourceNames"]))
        .collect();
    assert_eq!(
        lease_names,
        ["airflow-b-ingest"],
        "the Lease the ingest takes"
    );
    let other = roles
        .iter()
        .find(|r| r["metadata"]["namespace"] == "team-b")
        .expect("a Role in the other namespace");
    assert_eq!(strings(&other["rules"][0]["verbs"]), ["list", "watch"]);
    assert_eq!(strings(&other["rules"][0]["resources"]), ["pods"]);
    let binding = of_kind(&objects, "RoleBinding")
        .into_iter()
        .find(|b| b["metadata"]["namespace"] == "team-b")
        .expect("a RoleBinding in the other namespace");
    assert_eq!(binding["subjects"][0]["namespace"], "airflow");

    let rule = &of_kind(&objects, "PrometheusRule")[0];
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus");
    for alert in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let url = alert["annotations"]["runbook_url"].as_str().unwrap();
        assert!(
            url.starts_with("https://runbooks.example/podstream.md#"),
            "{url}"
        );
    }

    for (value, refusal) in [
        ("taskFailures=both", "taskFailures"),
        ("prefix=a b", "prefix"),
        ("nats.url=nats.nats.svc:4222", "url"),
        ("replicas=3", "replicas"),
    ] {
        let refused = helm_template("podstream", None, &[value]).unwrap_err();
        assert!(refused.contains(refusal), "{value}: {refused}");
    }
}

/// The chart's collector values become its flags and its Roles: one in each namespace it
/// collects in, with `patch` only when it labels pods instead of deleting them; a misspelt
/// collector value is refused.
#[test]
fn the_chart_collector_follows_its_values() {
    let objects = helm_template(
        "podstream",
        None,
        &[
            "collector.enabled=true",
            "namespaces={airflow,team-b}",
            "collector.deleteWorkerPods=false",
            "collector.deleteWorkerPodsOnFailure=true",
            "collector.graceSeconds=60",
            "collector.livePods=true",
        ],
    )
    .unwrap();
    let collect = of_kind(&objects, "Deployment")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "podstream-collect")
        .expect("the collector's Deployment");
    let args = strings(&collect["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert_parses(&args);
    for flag in [
        "--namespaces=airflow,team-b",
        "--delete-worker-pods=false",
        "--delete-worker-pods-on-failure=true",
        "--collect-grace-seconds=60",
        "--collect-live-pods",
    ] {
        assert!(args.contains(&flag), "{flag}: {args:?}");
    }
    let roles: Vec<(&str, Vec<&str>)> = of_kind(&objects, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["name"] == "podstream-collect")
        .map(|r| {
            (
                r["metadata"]["namespace"].as_str().unwrap(),
                strings(&r["rules"][0]["verbs"]),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [
            ("airflow", vec!["delete", "patch"]),
            ("team-b", vec!["delete", "patch"])
        ]
    );
    assert!(
        helm_template("podstream", None, &[])
            .unwrap()
            .iter()
            .all(|o| !o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .contains("collect")),
        "the collector is off by default"
    );
    let refused = helm_template("podstream", None, &["collector.enable=true"]).unwrap_err();
    assert!(refused.contains("enable"), "{refused}");
    let unsigned = [
        "collector.enabled=true",
        "collector.livePods=true",
        "taskFailures=sink",
    ];
    let refused = helm_template("podstream", None, &unsigned).unwrap_err();
    assert!(refused.contains("needs signed pods"), "{refused}");
}

/// Every Secret the install mounts (the overlays' volumes, podstream's chart with the values
/// the page gives, the Airflow chart values on docs/install.md) is one a `kubectl create
/// secret` step of that page creates: a Secret no
/// step creates leaves its pod in `ContainerCreating`.
#[test]
fn the_install_page_creates_every_secret_the_install_mounts() {
    let page = std::fs::read_to_string(workspace_root().join("docs/install.md")).unwrap();
    // Each Secret a step creates, with the keys it gives it.
    let joined = page.replace("\\\n", " ");
    let keys: std::collections::BTreeMap<String, Vec<String>> = joined
        .lines()
        .filter_map(|line| line.split_once("create secret generic "))
        .filter_map(|(_, rest)| {
            let mut words = rest.split_whitespace();
            let name = words.next()?.to_owned();
            let keys = words
                .filter_map(|w| {
                    w.strip_prefix("--from-file=")
                        .or_else(|| w.strip_prefix("--from-literal="))
                })
                .filter_map(|w| w.split_once('=').map(|(key, _)| key.to_owned()))
                .collect();
            Some((name, keys))
        })
        .collect();
    let created: std::collections::BTreeSet<String> = keys.keys().cloned().collect();
    let mut mounted = std::collections::BTreeSet::new();
    for (_, rest) in page
        .match_indices("secretName: ")
        .map(|(i, _)| page.split_at(i))
    {
        let name: String = rest["secretName: ".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        mounted.insert(name);
    }
    let dir = tempfile::tempdir().unwrap();
    for (overlay, _) in OVERLAYS {
        let (_, objects) = render(overlay, dir.path());
        for deployment in of_kind(&objects, "Deployment") {
            let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
            for volume in volumes.as_array().into_iter().flatten() {
                let mut names = vec![&volume["secret"]["secretName"]];
                for source in volume["projected"]["sources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    names.push(&source["secret"]["name"]);
                }
                mounted.extend(
                    names
                        .into_iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned),
                );
            }
        }
    }
    let values = dir.path().join("podstream-values.yaml");
    std::fs::write(&values, page_values(&page)).unwrap();
    let from_chart = helm_template("podstream", Some(&values), &[]).unwrap();
    let deployments = of_kind(&from_chart, "Deployment");
    assert_eq!(
        deployments.len(),
        4,
        "the page's values install the chart, the collector with it"
    );
    for deployment in deployments {
        let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
        // Each key a pod takes from a Secret is one the page puts there.
        for volume in volumes.as_array().into_iter().flatten() {
            let Some(secret) = volume["secret"]["secretName"].as_str() else {
                continue;
            };
            for item in volume["secret"]["items"].as_array().into_iter().flatten() {
                let key = item["key"].as_str().unwrap();
                assert!(
                    keys.get(secret)
                        .is_some_and(|given| given.iter().any(|k| k == key)),
                    "{}: key {key} of Secret {secret}, which the page does not give",
                    deployment["metadata"]["name"]
                );
            }
        }
        mounted.extend(
            volumes
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["secret"]["secretName"].as_str())
                .map(str::to_owned),
        );
    }
    assert!(mounted.len() >= 5, "too few Secrets found: {mounted:?}");
    let missing: Vec<&String> = mounted.difference(&created).collect();
    assert!(
        missing.is_empty(),
        "mounted but created by no step of docs/install.md: {missing:?} (created: {created:?})"
    );
}

/// The `podstream-values.yaml` docs/install.md gives for the chart: the YAML block after the
/// line that names it.
fn page_values(page: &str) -> String {
    let named = page
        .find("with `podstream-values.yaml`")
        .expect("docs/install.md gives podstream-values.yaml");
    let block = &page[named..];
    let block = &block[block.find("```yaml\n").unwrap() + "```yaml\n".len()..];
    block[..block.find("```").unwrap()].to_owned()
}

/// The `podstream check` commands of docs/install.md's last step: each component's, with the
/// arguments its Deployment runs with (the chart's, with the page's values and namespace),
/// so the check tries what the component does, and each parses.
#[test]
fn the_install_pages_checks_run_with_each_components_own_arguments() {
    let page = std::fs::read_to_string(workspace_root().join("docs/install.md")).unwrap();
    let joined = page.replace("\\\n", " ");
    let checks: Vec<Vec<&str>> = joined
        .lines()
        .filter_map(|l| l.split_once(" -- podstream check "))
        .map(|(_, args)| args.split_whitespace().collect())
        .collect();
    assert_eq!(checks.len(), 4, "one check per component:\n{checks:?}");
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("podstream-values.yaml");
    std::fs::write(&values, page_values(&page)).unwrap();
    let objects = helm_template("podstream", Some(&values), &[]).unwrap();
    for check in checks {
        let component = check[0];
        let deployment = of_kind(&objects, "Deployment")
            .into_iter()
            .find(|d| d["metadata"]["name"] == format!("podstream-{component}"))
            .unwrap_or_else(|| panic!("no Deployment runs {component}"));
        let runs: std::collections::BTreeSet<String> =
            strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"])
                .iter()
                .skip(1)
                .filter(|a| !a.starts_with("--task-failures="))
                .map(|a| a.replace("$(POD_NAMESPACE)", "airflow"))
                .collect();
        let checked: std::collections::BTreeSet<String> =
            check[1..].iter().map(|a| (*a).to_owned()).collect();
        assert_eq!(
            checked, runs,
            "{component}: the page checks other arguments"
        );
        let args: Vec<&str> = std::iter::once("check")
            .chain(check.iter().copied())
            .collect();
        assert_parses(&args);
    }
}

/// deploy/nats/values.yaml uses the NATS chart's own keys (nats-io/k8s `nats` 2.14.2, in
/// tests/fixtures/charts): rendered with it, it makes what docs/install.md step 1 asks for (a
/// cluster of three, JetStream with `sync_interval: always`, TLS for clients, podstream's
/// users included with every password from one Secret, the exporter with JetStream consumer
/// metrics and its PodMonitor), and the nats.conf it renders passes `nats-server -t` with the
/// users file, the passwords and a certificate where the pods mount them.
#[test]
fn the_nats_values_are_the_charts_own_and_make_what_the_page_asks() {
    let dir = tempfile::tempdir().unwrap();
    let rendered = run(Command::new(podstream_stage::control_plane::tool("helm"))
        .args(["template", "nats"])
        .arg(workspace_root().join("tests/fixtures/charts/nats"))
        .args(["--namespace", "nats", "--values"])
        .arg(workspace_root().join("deploy/nats/values.yaml")));
    let file = dir.path().join("nats.yaml");
    std::fs::write(&file, rendered).unwrap();
    let objects: Vec<Value> = yaml_documents(&file)
        .into_iter()
        .filter(|o| !o.is_null())
        .collect();

    let set = of_kind(&objects, "StatefulSet")[0];
    assert_eq!(set["spec"]["replicas"], 3);
    let pod = &set["spec"]["template"]["spec"];
    let nats = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "nats")
        .unwrap();
    let users = podstream_tests::nats::SHIPPED_USERS.map(str::to_uppercase);
    for user in &users {
        let variable = format!("PODSTREAM_{user}_PASSWORD");
        let env = nats["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == variable.as_str())
            .unwrap_or_else(|| panic!("no {variable}"));
        assert_eq!(
            env["valueFrom"]["secretKeyRef"]["name"], "podstream-nats-passwords",
            "{variable}"
        );
    }
    assert!(
        nats["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/etc/nats-config/podstream"),
        "{nats}"
    );
    // Every mount of every container has its volume: the chart's own (its configuration,
    // its TLS certificate) and the users file beside them.
    let claims = set["spec"]["volumeClaimTemplates"].as_array().unwrap();
    let volumes: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str())
        .chain(claims.iter().filter_map(|c| c["metadata"]["name"].as_str()))
        .collect();
    for container in pod["containers"].as_array().unwrap() {
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = mount["name"].as_str().unwrap();
            assert!(
                volumes.contains(&name),
                "{name} mounted, no such volume: {volumes:?}"
            );
        }
    }
    for needed in ["config", "podstream-users"] {
        assert!(volumes.contains(&needed), "no volume {needed}: {volumes:?}");
    }
    let exporter = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "prom-exporter")
        .expect("the exporter");
    assert!(
        strings(&exporter["args"]).contains(&"-jsz=all"),
        "{exporter}"
    );
    assert_eq!(of_kind(&objects, "PodMonitor").len(), 1);
    // What the pods mount, step 1 of the page creates.
    let page = std::fs::read_to_string(workspace_root().join("docs/install.md")).unwrap();
    for volume in pod["volumes"].as_array().unwrap() {
        let created = match (
            volume["configMap"]["name"].as_str(),
            volume["secret"]["secretName"].as_str(),
        ) {
            (Some(map), _) if map != "nats-config" => format!("create configmap {map} "),
            (_, Some(secret)) if secret == "nats-server-tls" => {
                format!("create secret tls {secret} ")
            }
            _ => continue,
        };
        assert!(
            page.contains(&created),
            "no step of install.md does `{created}`"
        );
    }
    assert!(page.contains("create secret generic podstream-nats-passwords "));

    let config = of_kind(&objects, "ConfigMap")
        .into_iter()
        .find_map(|c| c["data"]["nats.conf"].as_str())
        .expect("nats.conf")
        .to_owned();
    for wanted in [
        "include ./podstream/podstream-users.conf",
        "\"sync_interval\": \"always\"",
        "\"cert_file\": \"/etc/nats-certs/nats/tls.crt\"",
    ] {
        assert!(config.contains(wanted), "{wanted} not in\n{config}");
    }

    // The rendered file as nats-server reads it, what the pods mount moved under `dir`.
    let pki = podstream_stage::pki::Pki::new();
    let mounts = dir.path().join("mounts");
    std::fs::create_dir_all(mounts.join("certs")).unwrap();
    std::fs::create_dir_all(dir.path().join("podstream")).unwrap();
    std::fs::copy(pki.path("server.pem"), mounts.join("certs/tls.crt")).unwrap();
    std::fs::copy(pki.path("server-key.pem"), mounts.join("certs/tls.key")).unwrap();
    std::fs::copy(
        workspace_root().join("deploy/nats/podstream-users.conf"),
        dir.path().join("podstream/podstream-users.conf"),
    )
    .unwrap();
    let moved = config
        .replace(
            "/etc/nats-certs/nats",
            &mounts.join("certs").display().to_string(),
        )
        .replace("\"/data", &format!("\"{}", mounts.join("data").display()))
        .replace("/var/run/nats", &mounts.join("run").display().to_string());
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, moved).unwrap();
    let mut server = Command::new(podstream_stage::nats::nats_server_binary());
    server
        .arg("-c")
        .arg(&conf)
        .arg("-t")
        .env("SERVER_NAME", "nats-0");
    for user in &users {
        server.env(format!("PODSTREAM_{user}_PASSWORD"), "a-password");
    }
    run(&mut server);
}

/// The Airflow chart values of docs/install.md step 4 keep the schedulers' credentials to the
/// schedulers: worker pods log in as the users file's `podstream-spark` (the Spark bucket, read
/// only) with a password Secret of their own, and never mount the pod-signing key.
#[test]
fn the_worker_pods_get_their_own_user_and_no_signing_key() {
    let page = std::fs::read_to_string(workspace_root().join("docs/install.md")).unwrap();
    let from = page.find("Then the chart's values").unwrap();
    let block = &page[from..];
    let block = &block[block.find("```yaml\n").unwrap() + "```yaml\n".len()..];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("airflow-values.yaml");
    std::fs::write(&file, &block[..block.find("```").unwrap()]).unwrap();
    let values = yaml_documents(&file).remove(0);
    let users =
        std::fs::read_to_string(workspace_root().join("deploy/nats/podstream-users.conf")).unwrap();

    let scheduler_user = values["config"]["podstream"]["user"].as_str().unwrap();
    let workers = &values["workers"];
    let worker_user = workers["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "AIRFLOW__PODSTREAM__USER")
        .and_then(|e| e["value"].as_str())
        .expect("the workers' own NATS user");
    assert_ne!(worker_user, scheduler_user);
    assert!(
        users.contains(&format!("user: {worker_user}\n")),
        "{worker_user}"
    );
    let secrets = |component: &Value| -> Vec<String> {
        component["extraVolumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["secret"]["secretName"].as_str().map(str::to_owned))
            .collect()
    };
    let theirs = secrets(workers);
    let schedulers = secrets(&values["scheduler"]);
    assert!(
        !theirs.contains(&"podstream-pod-signing".to_owned()),
        "workers mount the signing key: {theirs:?}"
    );
    assert!(schedulers.contains(&"podstream-pod-signing".to_owned()));
    assert!(
        !theirs
            .iter()
            .any(|s| schedulers.contains(s) && s.contains("nats")),
        "workers mount the schedulers' NATS password: {theirs:?}"
    );
}

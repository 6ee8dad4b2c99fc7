//! What the kubelet will run for a pod, read from the pod alone: the first container's
//! program, arguments, environment and working directory, and the fault it was asked to
//! play. Pure: a pod in, a plan or the reason a real kubelet would refuse out.

use std::time::Duration;

use serde_json::Value;

/// The annotation that asks the kubelet to play a fault (`image-pull`, `oom`, `evicted`,
/// `node-lost`).
pub const FAULT_ANNOTATION: &str = "podstream/kubelet-fault";
/// Seconds after the container starts before the fault strikes (default 0).
pub const FAULT_AFTER_ANNOTATION: &str = "podstream/kubelet-fault-after-seconds";

/// A fault the kubelet plays on a pod, as a real node would report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The image cannot be pulled: `ErrImagePull`, then `ImagePullBackOff`; the pod stays Pending.
    ImagePull,
    /// The container is killed for memory: `OOMKilled`, exit code 137.
    OomKilled,
    /// The pod is evicted: `Failed` with `reason: Evicted`.
    Evicted,
    /// The node is lost: the process dies and the pod is deleted without a final status.
    NodeLost,
}

impl Fault {
    /// The annotation value that names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::ImagePull => "image-pull",
            Fault::OomKilled => "oom",
            Fault::Evicted => "evicted",
            Fault::NodeLost => "node-lost",
        }
    }

    /// The fault an annotation value names.
    pub fn parse(value: &str) -> Option<Fault> {
        [
            Fault::ImagePull,
            Fault::OomKilled,
            Fault::Evicted,
            Fault::NodeLost,
        ]
        .into_iter()
        .find(|f| f.as_str() == value)
    }
}

/// Facts about the node a pod runs on, for `fieldRef`s.
#[derive(Debug, Clone)]
pub struct Node {
    /// `spec.nodeName`.
    pub name: String,
    /// `status.hostIP` and `status.podIP`: processes run on this host.
    pub ip: String,
}

/// What to run for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The first app container's name.
    pub container: String,
    /// The program: `command[0]`, else `args[0]` (the image's entrypoint is not known).
    pub program: String,
    /// The rest of `command` and `args`.
    pub args: Vec<String>,
    /// The container's environment, resolved, in order (on top of the kubelet's base one).
    pub env: Vec<(String, String)>,
    /// `workingDir`, if set.
    pub working_dir: Option<String>,
    /// A fault to play, and when after the start.
    pub fault: Option<(Fault, Duration)>,
}

/// Why a real kubelet would not start the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `CreateContainerConfigError`: the pod stays Pending with this waiting reason.
    Config(String),
    /// `ContainerCannotRun`: the container terminates at once with exit code 128.
    CannotRun(String),
}

/// Plans the first app container of `pod` on `node`.
pub fn plan(pod: &Value, node: &Node) -> Result<Launch, Refusal> {
    let container = pod["spec"]["containers"]
        .get(0)
        .ok_or_else(|| Refusal::CannotRun("the pod has no containers".into()))?;
    let name = container["name"].as_str().unwrap_or_default().to_owned();
    let fault = fault(pod)?;
    let env = environment(pod, container, node)?;
    let lookup = |var: &str| env.iter().rev().find(|(k, _)| k == var).map(|(_, v)| v);
    let expand_all = |list: &Value| -> Vec<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|v| expand(v.as_str().unwrap_or_default(), &lookup))
            .collect()
    };
    let mut words = expand_all(&container["command"]);
    words.extend(expand_all(&container["args"]));
    if words.is_empty() {
        return Err(Refusal::CannotRun(format!(
            "container {name:?} has neither command nor args: the simulator's kubelet runs no images, only commands"
        )));
    }
    let program = words.remove(0);
    Ok(Launch {
        container: name,
        program,
        args: words,
        working_dir: container["workingDir"]
            .as_str()
            .filter(|d| !d.is_empty())
            .map(str::to_owned),
        env,
        fault,
    })
}

fn fault(pod: &Value) -> Result<Option<(Fault, Duration)>, Refusal> {
    let annotations = &pod["metadata"]["annotations"];
    let Some(value) = annotations[FAULT_ANNOTATION].as_str() else {
        return Ok(None);
    };
    let fault = Fault::parse(value).ok_or_else(|| {
        Refusal::Config(format!(
            "annotation {FAULT_ANNOTATION}: unknown fault {value:?} (image-pull, oom, evicted, node-lost)"
        ))
    })?;
    let after = match annotations[FAULT_AFTER_ANNOTATION].as_str() {
        None => 0.0,
        Some(text) => text
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .ok_or_else(|| {
                Refusal::Config(format!(
                    "annotation {FAULT_AFTER_ANNOTATION}: {text:?} is not a number of seconds"
                ))
            })?,
    };
    Ok(Some((fault, Duration::from_secs_f64(after))))
}

/// The container's `env`, each value expanded against the variables before it, `valueFrom`
/// resolved where the simulator has the facts.
fn environment(
    pod: &Value,
    container: &Value,
    node: &Node,
) -> Result<Vec<(String, String)>, Refusal> {
    let mut env: Vec<(String, String)> = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let Some(name) = var["name"].as_str() else {
            continue;
        };
        let value = if let Some(from) = var.get("valueFrom") {
            match value_from(pod, from, node)? {
                Some(value) => value,
                None => continue,
            }
        } else {
            let lookup = |k: &str| env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v);
            expand(var["value"].as_str().unwrap_or_default(), &lookup)
        };
        env.push((name.to_owned(), value));
    }
    Ok(env)
}

/// A `valueFrom`: `Some` value, `None` for an optional reference that is absent.
fn value_from(pod: &Value, from: &Value, node: &Node) -> Result<Option<String>, Refusal> {
    if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
        return field_ref(pod, path, node)
            .map(Some)
            .ok_or_else(|| Refusal::Config(format!("unsupported fieldRef fieldPath {path:?}")));
    }
    for (key, kind) in [("secretKeyRef", "secret"), ("configMapKeyRef", "configmap")] {
        if let Some(reference) = from.get(key) {
            if reference["optional"].as_bool() == Some(true) {
                return Ok(None);
            }
            let name = reference["name"].as_str().unwrap_or_default();
            return Err(Refusal::Config(format!("{kind} {name:?} not found")));
        }
    }
    Err(Refusal::Config(format!(
        "valueFrom {from} cannot be resolved by the simulator's kubelet"
    )))
}

fn field_ref(pod: &Value, path: &str, node: &Node) -> Option<String> {
    let meta = &pod["metadata"];
    let text = |v: &Value| v.as_str().map(str::to_owned);
    if let Some(rest) = path.strip_prefix("metadata.labels['") {
        return text(&meta["labels"][rest.strip_suffix("']")?]).or(Some(String::new()));
    }
    if let Some(rest) = path.strip_prefix("metadata.annotations['") {
        return text(&meta["annotations"][rest.strip_suffix("']")?]).or(Some(String::new()));
    }
    match path {
        "metadata.name" => text(&meta["name"]),
        "metadata.namespace" => text(&meta["namespace"]),
        "metadata.uid" => text(&meta["uid"]),
        "spec.nodeName" => Some(node.name.clone()),
        "spec.serviceAccountName" => text(&pod["spec"]["serviceAccountName"]),
        "status.hostIP" | "status.podIP" | "status.hostIPs" | "status.podIPs" => {
            Some(node.ip.clone())
        }
        _ => None,
    }
}

/// Kubernetes' `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`,
/// anything else stays as written.
fn expand<'a>(text: &str, lookup: &impl Fn(&str) -> Option<&'a String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
            && let Some(value) = lookup(&inner[..end])
        {
            out.push_str(value);
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node() -> Node {
        Node {
            name: "sim-node".into(),
            ip: "127.0.0.1".into(),
        }
    }

    fn pod(container: Value) -> Value {
        json!({
            "metadata": { "name": "p", "namespace": "airflow", "uid": "u-1",
                          "labels": { "airflow-worker": "7" } },
            "spec": { "containers": [container], "serviceAccountName": "default" },
        })
    }

    #[test]
    fn command_and_args_make_the_program_line() {
        let cases = [
            (
                json!({"name": "base", "command": ["sh", "-c"], "args": ["exit 3"]}),
                "sh",
                vec!["-c", "exit 3"],
            ),
            (
                json!({"name": "base", "args": ["airflow", "tasks", "run"]}),
                "airflow",
                vec!["tasks", "run"],
            ),
            (json!({"name": "base", "command": ["true"]}), "true", vec![]),
        ];
        for (container, program, args) in cases {
            let launch = plan(&pod(container.clone()), &node()).unwrap();
            assert_eq!(launch.program, program, "{container}");
            assert_eq!(launch.args, args, "{container}");
        }
    }

    #[test]
    fn refusals_are_what_a_kubelet_reports() {
        let cases = [
            (json!({"name": "base", "image": "x"}), "CannotRun"),
            (
                json!({"name": "base", "command": ["true"],
                    "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}),
                "Config",
            ),
            (
                json!({"name": "base", "command": ["true"],
                    "env": [{"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "status.nope"}}}]}),
                "Config",
            ),
        ];
        for (container, expected) in cases {
            let refusal = plan(&pod(container.clone()), &node()).unwrap_err();
            let kind = match refusal {
                Refusal::Config(_) => "Config",
                Refusal::CannotRun(_) => "CannotRun",
            };
            assert_eq!(kind, expected, "{container}");
        }
        assert_eq!(
            plan(&json!({"spec": {}}), &node()).unwrap_err(),
            Refusal::CannotRun("the pod has no containers".into())
        );
    }

    #[test]
    fn env_resolves_values_field_refs_and_expansions() {
        let container = json!({
            "name": "base",
            "command": ["echo", "$(GREETING) from $(POD)", "$$(POD)", "$(UNSET)"],
            "env": [
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "OWNER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['airflow-worker']"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "GREETING", "value": "hello $(OWNER)"},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k", "optional": true}}},
            ],
        });
        let launch = plan(&pod(container), &node()).unwrap();
        assert_eq!(
            launch.env,
            [
                ("POD", "p"),
                ("OWNER", "7"),
                ("NODE", "sim-node"),
                ("GREETING", "hello 7")
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(launch.args, ["hello 7 from p", "$(POD)", "$(UNSET)"]);
    }

    #[test]
    fn faults_come_from_annotations() {
        let mut with_fault = pod(json!({"name": "base", "command": ["sleep", "9"]}));
        with_fault["metadata"]["annotations"] =
            json!({ FAULT_ANNOTATION: "oom", FAULT_AFTER_ANNOTATION: "1.5" });
        let launch = plan(&with_fault, &node()).unwrap();
        assert_eq!(
            launch.fault,
            Some((Fault::OomKilled, Duration::from_millis(1500)))
        );
        with_fault["metadata"]["annotations"][FAULT_ANNOTATION] = json!("meteor");
        assert!(matches!(
            plan(&with_fault, &node()),
            Err(Refusal::Config(_))
        ));
    }
}

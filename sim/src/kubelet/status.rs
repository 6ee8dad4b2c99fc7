//! The status a kubelet writes, as pure changes to a pod's JSON: bound to the node, waiting,
//! running, terminated, evicted, or unschedulable on a full node.

use serde_json::{Value, json};

use super::plan::Node;
use crate::cluster::ContainerState;
use crate::object::now_rfc3339;

/// The pod is bound to `node` and its containers are being created.
pub fn scheduled(pod: &mut Value, node: &Node, container: &str) {
    pod["spec"]["nodeName"] = json!(node.name);
    let now = now_rfc3339();
    let status = &mut pod["status"];
    status["phase"] = json!("Pending");
    status["hostIP"] = json!(node.ip);
    status["hostIPs"] = json!([{ "ip": node.ip }]);
    status["startTime"] = json!(now);
    status["conditions"] = json!([
        condition("PodScheduled", true, &now),
        condition("Initialized", true, &now),
        condition("Ready", false, &now),
        condition("ContainersReady", false, &now),
    ]);
    set_container(
        pod,
        container,
        &ContainerState::Waiting {
            reason: "ContainerCreating".into(),
            message: String::new(),
        },
    );
}

/// The node is full: the pod stays Pending, unscheduled, as the scheduler reports it.
pub fn unschedulable(pod: &mut Value, max_pods: usize) {
    let now = now_rfc3339();
    pod["status"]["phase"] = json!("Pending");
    let mut scheduled = condition("PodScheduled", false, &now);
    scheduled["reason"] = json!("Unschedulable");
    scheduled["message"] = json!(format!(
        "0/1 nodes are available: 1 Too many pods (the simulator's kubelet runs at most {max_pods})."
    ));
    pod["status"]["conditions"] = json!([scheduled]);
}

/// The container started: the pod is Running and Ready.
pub fn running(pod: &mut Value, node: &Node, container: &str) {
    let now = now_rfc3339();
    let status = &mut pod["status"];
    status["phase"] = json!("Running");
    status["podIP"] = json!(node.ip);
    status["podIPs"] = json!([{ "ip": node.ip }]);
    set_conditions(pod, true, &now);
    set_container(pod, container, &ContainerState::Running);
}

/// The container ended: `Succeeded` on exit code 0, else `Failed`.
pub fn terminated(pod: &mut Value, container: &str, exit_code: i32, reason: &str, message: &str) {
    let now = now_rfc3339();
    pod["status"]["phase"] = json!(if exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    });
    set_conditions(pod, false, &now);
    set_container(
        pod,
        container,
        &ContainerState::Terminated {
            exit_code,
            reason: reason.to_owned(),
            message: message.to_owned(),
        },
    );
}

/// The kubelet evicted the pod: `Failed`, `reason: Evicted`, the container killed.
pub fn evicted(pod: &mut Value, container: &str) {
    terminated(pod, container, 137, "Error", "");
    pod["status"]["reason"] = json!("Evicted");
    pod["status"]["message"] =
        json!("The node was low on resource: memory. (podstream simulator fault: evicted)");
}

/// One container's state; the entry is created if missing (in `initContainerStatuses` for an
/// init container). `startedAt` of a running container is kept when it terminates.
pub fn set_container(pod: &mut Value, container: &str, state: &ContainerState) {
    let is_init = pod["spec"]["initContainers"]
        .as_array()
        .is_some_and(|list| list.iter().any(|c| c["name"] == container));
    let image = ["initContainers", "containers"]
        .iter()
        .filter_map(|list| pod["spec"][list].as_array())
        .flatten()
        .find(|c| c["name"] == container)
        .and_then(|c| c["image"].as_str())
        .unwrap_or_default()
        .to_owned();
    let list_name = if is_init {
        "initContainerStatuses"
    } else {
        "containerStatuses"
    };
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let list = &mut pod["status"][list_name];
    if !list.is_array() {
        *list = json!([]);
    }
    let Some(list) = list.as_array_mut() else {
        return;
    };
    let at = match list.iter().position(|c| c["name"] == container) {
        Some(at) => at,
        None => {
            // Every field the API marks required (the Python client refuses a status without
            // `imageID`); there is no image, so its id names the simulator.
            list.push(json!({
                "name": container,
                "image": image,
                "imageID": format!("podstream-sim://{image}"),
                "restartCount": 0,
                "ready": false,
            }));
            list.len() - 1
        }
    };
    let entry = &mut list[at];
    let started_at = entry["state"]["running"]["startedAt"].clone();
    let now = now_rfc3339();
    let (state_json, ready) = match state {
        ContainerState::Waiting { reason, message } => {
            let mut waiting = json!({ "reason": reason });
            if !message.is_empty() {
                waiting["message"] = json!(message);
            }
            (json!({ "waiting": waiting }), false)
        }
        ContainerState::Running => (json!({ "running": { "startedAt": now } }), true),
        ContainerState::Terminated {
            exit_code,
            reason,
            message,
        } => {
            let mut terminated =
                json!({ "exitCode": exit_code, "reason": reason, "finishedAt": now });
            terminated["startedAt"] = if started_at.is_null() {
                json!(now)
            } else {
                started_at
            };
            if !message.is_empty() {
                terminated["message"] = json!(message);
            }
            (json!({ "terminated": terminated }), false)
        }
    };
    entry["state"] = state_json;
    entry["ready"] = json!(ready);
    entry["started"] = json!(ready);
}

fn condition(kind: &str, status: bool, now: &str) -> Value {
    json!({
        "type": kind,
        "status": if status { "True" } else { "False" },
        "lastTransitionTime": now,
    })
}

fn set_conditions(pod: &mut Value, ready: bool, now: &str) {
    let Some(conditions) = pod["status"]["conditions"].as_array_mut() else {
        return;
    };
    for entry in conditions.iter_mut() {
        if matches!(entry["type"].as_str(), Some("Ready" | "ContainersReady")) {
            *entry = condition(entry["type"].as_str().unwrap_or_default(), ready, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": { "name": "p" },
            "spec": { "containers": [{ "name": "base", "image": "img" }] },
            "status": { "phase": "Pending" },
        })
    }

    fn node() -> Node {
        Node {
            name: "n".into(),
            ip: "127.0.0.1".into(),
        }
    }

    #[test]
    fn a_pod_goes_pending_running_and_ends_by_its_exit_code() {
        let mut pod = pod();
        scheduled(&mut pod, &node(), "base");
        assert_eq!(pod["spec"]["nodeName"], "n");
        assert_eq!(
            pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        running(&mut pod, &node(), "base");
        assert_eq!(pod["status"]["phase"], "Running");
        assert_eq!(pod["status"]["podIP"], "127.0.0.1");
        let ready = pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()
            .clone();
        assert_eq!(ready["status"], "True");
        let started =
            pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();
        for (code, reason, phase) in [(0, "Completed", "Succeeded"), (2, "Error", "Failed")] {
            let mut ended = pod.clone();
            terminated(&mut ended, "base", code, reason, "");
            let state = &ended["status"]["containerStatuses"][0]["state"]["terminated"];
            assert_eq!(ended["status"]["phase"], phase);
            assert_eq!(state["exitCode"], code);
            assert_eq!(state["reason"], reason);
            assert_eq!(state["startedAt"], started);
        }
    }

    #[test]
    fn eviction_and_a_full_node_read_as_on_a_cluster() {
        let mut pod = pod();
        evicted(&mut pod, "base");
        assert_eq!(pod["status"]["phase"], "Failed");
        assert_eq!(pod["status"]["reason"], "Evicted");
        let mut waiting = self::pod();
        unschedulable(&mut waiting, 2);
        assert_eq!(
            waiting["status"]["conditions"][0]["reason"],
            "Unschedulable"
        );
        assert_eq!(waiting["status"]["conditions"][0]["status"], "False");
    }
}

//! The status a kubelet writes, as pure changes to a pod's JSON: bound to the node, waiting,
//! running, terminated, evicted, or unschedulable on a full node.

use serde_json::{Value, json};

use super::plan::Node;
use crate::container::{ContainerState, set_container};
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

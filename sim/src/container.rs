//! A container as a pod shows it: its state ([`ContainerState`]), written into the pod's
//! status ([`set_container`]), and where its log lives ([`log_path`]). Shared by the kubelet,
//! which runs containers, and the cluster's control API, which sets their states.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::object::now_rfc3339;

/// A container state, as `containerStatuses[].state` shows it: what the kubelet writes, and
/// what the control API sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    /// `waiting` with a reason such as `ContainerCreating` or `ImagePullBackOff`.
    Waiting {
        /// The waiting reason.
        reason: String,
        /// Why, in words (may be empty).
        message: String,
    },
    /// `running` since now.
    Running,
    /// `terminated` with an exit code and reason.
    Terminated {
        /// The exit code (128 + the signal's number for a signal).
        exit_code: i32,
        /// `Completed`, `Error`, `OOMKilled`, `ContainerCannotRun`.
        reason: String,
        /// Why, in words (may be empty).
        message: String,
    },
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

/// Where a pod's container log lives under the kubelet's root.
pub fn log_path(root: &Path, namespace: &str, name: &str, uid: &str, container: &str) -> PathBuf {
    root.join(namespace)
        .join(format!("{name}_{uid}"))
        .join(format!("{container}.log"))
}

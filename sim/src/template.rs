//! Pods shaped like the ones Airflow's KubernetesExecutor creates, for tests and the demo.

use serde_json::{Value, json};

/// What identifies an Airflow worker pod: its task instance and the scheduler that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPod {
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The owning scheduler's job id: the `airflow-worker` label.
    pub owner: String,
    /// `dag_id` annotation.
    pub dag_id: String,
    /// `task_id` annotation.
    pub task_id: String,
    /// `run_id` annotation.
    pub run_id: String,
    /// `try_number` annotation.
    pub try_number: u32,
    /// `map_index` annotation, for mapped tasks.
    pub map_index: Option<i64>,
    /// `task_instance_id` annotation: the TI's UUID, as Airflow 3's executor writes it.
    pub task_instance_id: Option<String>,
}

impl WorkerPod {
    /// A worker pod for `dag/task` in run `run_id`, try 1, in namespace `airflow`.
    pub fn new(name: &str, owner: &str, dag_id: &str, task_id: &str, run_id: &str) -> WorkerPod {
        WorkerPod {
            name: name.to_owned(),
            namespace: "airflow".to_owned(),
            owner: owner.to_owned(),
            dag_id: dag_id.to_owned(),
            task_id: task_id.to_owned(),
            run_id: run_id.to_owned(),
            try_number: 1,
            map_index: None,
            task_instance_id: None,
        }
    }

    /// This pod naming the TI's UUID (`None` for an Airflow 2 TI, which has none).
    pub fn with_task_instance_id(self, id: Option<&str>) -> WorkerPod {
        WorkerPod {
            task_instance_id: id.map(str::to_owned),
            ..self
        }
    }

    /// The pod as the executor submits it: Pending, labels made label-safe, the TI key in
    /// annotations.
    pub fn to_json(&self) -> Value {
        let mut annotations = json!({
            "dag_id": self.dag_id,
            "task_id": self.task_id,
            "run_id": self.run_id,
            "try_number": self.try_number.to_string(),
        });
        let mut labels = json!({
            "airflow-worker": self.owner,
            "dag_id": label_safe(&self.dag_id),
            "task_id": label_safe(&self.task_id),
            "run_id": label_safe(&self.run_id),
            "try_number": self.try_number.to_string(),
            "kubernetes_executor": "True",
        });
        if let Some(id) = &self.task_instance_id {
            annotations["task_instance_id"] = json!(id);
        }
        if let Some(index) = self.map_index {
            annotations["map_index"] = json!(index.to_string());
            labels["map_index"] = json!(index.to_string());
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "base",
                    "image": "apache/airflow:2.10.5",
                    "args": ["airflow", "tasks", "run", self.dag_id, self.task_id, self.run_id],
                }],
            },
            "status": { "phase": "Pending" },
        })
    }
}

/// A label value made from any string the way Airflow does: invalid characters replaced and,
/// when anything changed or it is too long, a short hash appended.
pub fn label_safe(value: &str) -> String {
    let safe: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.len() <= 63 && safe == value {
        return safe;
    }
    let digest = fnv_hex(value);
    let keep = 63 - digest.len() - 1;
    let head: String = safe.chars().take(keep).collect();
    let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{digest}")
}

/// A 9-hex-digit FNV-1a digest: stable and dependency-free (Airflow uses md5; any stable hash
/// keeps the label unique and valid).
fn fnv_hex(value: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in value.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:09x}", hash & 0xf_ffff_ffff)
}

//! Projection of a worker pod into a `PodEvent`: identity, owner, the TI key
//! from annotations, phase, deletion, and the container states the rules read.
//! Never the whole pod. See semantics.md "Identity".

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use podstream_proto::v1::{
    ContainerTerminated, ContainerWaiting, EventType, Phase, PodEvent, PodRef, TaskKey,
};
use thiserror::Error;

/// Label whose value is the owning scheduler's job id.
pub const OWNER_LABEL: &str = "airflow-worker";
/// Label set when the executor has finished with the pod.
pub const DONE_LABEL: &str = "airflow_executor_done";
/// Label set when the executor deliberately revoked the pod.
pub const REVOKED_LABEL: &str = "airflow_pod_revoked";

/// Why a pod cannot become a `PodEvent`. Each becomes an `invalid` line in
/// `podstream decide` and a dead letter in the pipeline, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProjectionError {
    /// The pod has no `metadata.uid`, so its events cannot be ordered.
    #[error("pod has no metadata.uid")]
    NoUid,
    /// The pod carries no `airflow-worker` label: not a worker pod.
    #[error("pod has no `{OWNER_LABEL}` label")]
    NoOwner,
    /// The pod has no annotations at all.
    #[error("pod has no annotations, so no task instance key")]
    NoAnnotations,
    /// A key annotation is absent.
    #[error("pod has no `{0}` annotation")]
    MissingAnnotation(&'static str),
    /// Neither `run_id` nor a logical date names the DAG run.
    #[error("pod has none of the `run_id`, `execution_date`, `logical_date` annotations")]
    NoRun,
    /// A numeric annotation is not an integer.
    #[error("annotation `{annotation}` is {value:?}, not an integer")]
    NotAnInteger {
        /// Which annotation.
        annotation: &'static str,
        /// What it held.
        value: String,
    },
}

/// The pod reference of `pod`, with empty strings for what it lacks.
pub fn pod_ref(pod: &Pod) -> PodRef {
    let meta = &pod.metadata;
    PodRef {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    }
}

/// Projects one watch event of `pod` into a `PodEvent`.
pub fn project(event_type: EventType, pod: &Pod) -> Result<PodEvent, ProjectionError> {
    let meta = &pod.metadata;
    let uid = meta
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(ProjectionError::NoUid)?;
    let labels = meta.labels.as_ref();
    let label = |name: &str| labels.and_then(|l| l.get(name)).map(String::as_str);
    let owner = label(OWNER_LABEL).ok_or(ProjectionError::NoOwner)?;
    let task = task_key(pod)?;

    let status = pod.status.as_ref();
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        Some("Pending") => Phase::Pending,
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        Some("Unknown") => Phase::Unknown,
        _ => Phase::Unspecified,
    };
    let init_statuses = status
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default();
    let app_statuses = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();

    Ok(PodEvent {
        r#type: event_type.into(),
        pod: Some(PodRef {
            uid: uid.to_owned(),
            ..pod_ref(pod)
        }),
        owner: owner.to_owned(),
        task: Some(task),
        phase: phase.into(),
        status_reason: status.and_then(|s| s.reason.clone()).unwrap_or_default(),
        deletion_unix_ms: meta.deletion_timestamp.as_ref().map(unix_ms),
        creation_unix_ms: meta.creation_timestamp.as_ref().map_or(0, unix_ms),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        init_waiting: init_statuses.iter().filter_map(waiting).collect(),
        first_app_waiting: first_app_status(pod, app_statuses).and_then(waiting),
        terminated: init_statuses
            .iter()
            .chain(app_statuses)
            .filter_map(terminated)
            .collect(),
        executor_done: is_true(label(DONE_LABEL)),
        revoked: is_true(label(REVOKED_LABEL)),
        synthesized: false,
    })
}

/// The TI key from annotations; labels of the same names are hashed by
/// Airflow and never used.
fn task_key(pod: &Pod) -> Result<TaskKey, ProjectionError> {
    let annotations = pod
        .metadata
        .annotations
        .as_ref()
        .ok_or(ProjectionError::NoAnnotations)?;
    let get = |name: &'static str| {
        annotations
            .get(name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    let need = |name: &'static str| get(name).ok_or(ProjectionError::MissingAnnotation(name));
    let integer = |name: &'static str, value: &str| {
        value
            .parse::<i64>()
            .map_err(|_| ProjectionError::NotAnInteger {
                annotation: name,
                value: value.to_owned(),
            })
    };

    let dag_id = need("dag_id")?;
    let task_id = need("task_id")?;
    let try_number = integer("try_number", need("try_number")?)?;
    let map_index = get("map_index").map_or(Ok(-1), |v| integer("map_index", v))?;
    let run_id = get("run_id").unwrap_or_default();
    let logical_date = if run_id.is_empty() {
        get("logical_date")
            .or_else(|| get("execution_date"))
            .ok_or(ProjectionError::NoRun)?
    } else {
        ""
    };
    Ok(TaskKey {
        dag_id: dag_id.to_owned(),
        task_id: task_id.to_owned(),
        run_id: run_id.to_owned(),
        map_index,
        try_number,
        logical_date: logical_date.to_owned(),
    })
}

/// The status of the first container of the spec (Airflow's `base`).
///
/// kubelet reports container statuses sorted by name, not in spec order, so
/// the first status is not always the base container; match by name and fall
/// back to the first status when the spec is absent.
fn first_app_status<'a>(pod: &Pod, statuses: &'a [ContainerStatus]) -> Option<&'a ContainerStatus> {
    let first_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.as_str());
    match first_name {
        Some(name) => statuses.iter().find(|s| s.name == name),
        None => statuses.first(),
    }
}

fn waiting(status: &ContainerStatus) -> Option<ContainerWaiting> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    Some(ContainerWaiting {
        container: status.name.clone(),
        reason: waiting.reason.clone().unwrap_or_default(),
        message: waiting.message.clone().unwrap_or_default(),
    })
}

fn terminated(status: &ContainerStatus) -> Option<ContainerTerminated> {
    let terminated = status.state.as_ref()?.terminated.as_ref()?;
    Some(ContainerTerminated {
        container: status.name.clone(),
        exit_code: terminated.exit_code,
        reason: terminated.reason.clone().unwrap_or_default(),
    })
}

fn unix_ms(time: &Time) -> i64 {
    time.0.as_millisecond()
}

fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

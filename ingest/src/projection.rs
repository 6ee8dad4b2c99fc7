//! Projection of a worker pod into a `PodEvent`: identity, owner, the TI key
//! from annotations, phase, deletion, and the container states the rules read.
//! Never the whole pod. See docs/semantics.md "Identity".

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
pub use podstream_proto::signature::SIGNATURE_ANNOTATION;
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
    /// `task_instance_id` is not a UUID. Authoritative when present: the name annotations
    /// are not a fallback (they could attach a stale pod to another attempt).
    #[error("annotation `task_instance_id` is {0:?}, not a UUID")]
    InvalidTaskInstanceId(String),
    /// A name in the key is outside the bounds podstream accepts (too long, a control
    /// character): it could name no Airflow task instance.
    #[error("annotations out of bounds: {0}")]
    Unbounded(#[from] podstream_proto::task::Unbounded),
    /// A numeric annotation is not an integer.
    #[error("annotation `{annotation}` is {value:?}, not an integer")]
    NotAnInteger {
        /// Which annotation.
        annotation: &'static str,
        /// What it held.
        value: String,
    },
}

/// The facts of one pod that the projection reads, borrowed from wherever
/// the pod was parsed: a k8s-openapi [`Pod`] ([`PodFacts::of`]) or JSON read
/// leanly ([`crate::pod_json`]). One projection, [`project_facts`], for both.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodFacts<'a> {
    /// `metadata.uid`.
    pub uid: Option<&'a str>,
    /// `metadata.namespace`.
    pub namespace: Option<&'a str>,
    /// `metadata.name`.
    pub name: Option<&'a str>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<&'a str>,
    /// `metadata.creationTimestamp`, Unix milliseconds.
    pub creation_unix_ms: Option<i64>,
    /// `metadata.deletionTimestamp`, Unix milliseconds.
    pub deletion_unix_ms: Option<i64>,
    /// The labels the rules read.
    pub labels: Labels<'a>,
    /// The TI key annotations; `None` when the pod has no annotations at all.
    pub annotations: Option<KeyAnnotations<'a>>,
    /// `status.phase`.
    pub phase: Option<&'a str>,
    /// `status.reason`.
    pub status_reason: Option<&'a str>,
    /// The name of the first container of the spec (Airflow's `base`).
    ///
    /// kubelet reports container statuses sorted by name, not in spec order,
    /// so the first status is not always the base container; the status is
    /// matched by this name, or is the first status when there is none.
    pub first_container: Option<&'a str>,
    /// `status.initContainerStatuses`.
    pub init_statuses: Vec<StatusFacts<'a>>,
    /// `status.containerStatuses`.
    pub app_statuses: Vec<StatusFacts<'a>>,
}

/// The labels the rules read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Labels<'a> {
    /// [`OWNER_LABEL`].
    pub owner: Option<&'a str>,
    /// [`DONE_LABEL`].
    pub done: Option<&'a str>,
    /// [`REVOKED_LABEL`].
    pub revoked: Option<&'a str>,
}

/// The annotations that name the task instance.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KeyAnnotations<'a> {
    /// `dag_id`.
    pub dag_id: Option<&'a str>,
    /// `task_id`.
    pub task_id: Option<&'a str>,
    /// `run_id`.
    pub run_id: Option<&'a str>,
    /// `try_number`.
    pub try_number: Option<&'a str>,
    /// `map_index`.
    pub map_index: Option<&'a str>,
    /// `logical_date` (Airflow 3).
    pub logical_date: Option<&'a str>,
    /// `execution_date` (Airflow 2, pods older than run ids).
    pub execution_date: Option<&'a str>,
    /// `task_instance_id`: the TI's UUID (cncf.kubernetes 10.25 and later).
    pub task_instance_id: Option<&'a str>,
    /// [`SIGNATURE_ANNOTATION`]: the launching executor's signature.
    pub signature: Option<&'a str>,
}

/// One container status, as far as the rules read it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StatusFacts<'a> {
    /// The container's name.
    pub name: &'a str,
    /// `state.waiting`: reason and message.
    pub waiting: Option<(Option<&'a str>, Option<&'a str>)>,
    /// `state.terminated`: exit code and reason.
    pub terminated: Option<(i32, Option<&'a str>)>,
}

impl<'a> PodFacts<'a> {
    /// The facts of a k8s-openapi `Pod`.
    pub fn of(pod: &'a Pod) -> Self {
        let first_container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.as_str());
        PodFacts::from_parts(&pod.metadata, first_container, pod.status.as_ref())
    }

    /// The facts of a pod given as its metadata, its first container's name and its status.
    pub fn from_parts(
        meta: &'a ObjectMeta,
        first_container: Option<&'a str>,
        status: Option<&'a PodStatus>,
    ) -> Self {
        let labels = meta.labels.as_ref();
        let label = |name: &str| labels.and_then(|l| l.get(name)).map(String::as_str);
        let annotations = meta.annotations.as_ref().map(|a| {
            let get = |name: &str| a.get(name).map(String::as_str);
            KeyAnnotations {
                dag_id: get("dag_id"),
                task_id: get("task_id"),
                run_id: get("run_id"),
                try_number: get("try_number"),
                map_index: get("map_index"),
                logical_date: get("logical_date"),
                execution_date: get("execution_date"),
                task_instance_id: get("task_instance_id"),
                signature: get(SIGNATURE_ANNOTATION),
            }
        });
        let statuses = |list: Option<&'a Vec<ContainerStatus>>| {
            list.map(|l| l.iter().map(StatusFacts::of).collect())
                .unwrap_or_default()
        };
        PodFacts {
            uid: meta.uid.as_deref(),
            namespace: meta.namespace.as_deref(),
            name: meta.name.as_deref(),
            resource_version: meta.resource_version.as_deref(),
            creation_unix_ms: meta.creation_timestamp.as_ref().map(unix_ms),
            deletion_unix_ms: meta.deletion_timestamp.as_ref().map(unix_ms),
            labels: Labels {
                owner: label(OWNER_LABEL),
                done: label(DONE_LABEL),
                revoked: label(REVOKED_LABEL),
            },
            annotations,
            phase: status.and_then(|s| s.phase.as_deref()),
            status_reason: status.and_then(|s| s.reason.as_deref()),
            first_container,
            init_statuses: statuses(status.and_then(|s| s.init_container_statuses.as_ref())),
            app_statuses: statuses(status.and_then(|s| s.container_statuses.as_ref())),
        }
    }

    /// The pod reference, with empty strings for what it lacks.
    pub fn pod_ref(&self) -> PodRef {
        PodRef {
            namespace: self.namespace.unwrap_or_default().to_owned(),
            name: self.name.unwrap_or_default().to_owned(),
            uid: self.uid.unwrap_or_default().to_owned(),
        }
    }
}

impl<'a> StatusFacts<'a> {
    fn of(status: &'a ContainerStatus) -> Self {
        let state = status.state.as_ref();
        StatusFacts {
            name: &status.name,
            waiting: state
                .and_then(|s| s.waiting.as_ref())
                .map(|w| (w.reason.as_deref(), w.message.as_deref())),
            terminated: state
                .and_then(|s| s.terminated.as_ref())
                .map(|t| (t.exit_code, t.reason.as_deref())),
        }
    }
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
    project_facts(event_type, &PodFacts::of(pod))
}

/// A pod's `status.phase` as Kubernetes names it; anything else is `Unspecified`.
pub fn phase_named(name: Option<&str>) -> Phase {
    match name {
        Some("Pending") => Phase::Pending,
        Some("Running") => Phase::Running,
        Some("Succeeded") => Phase::Succeeded,
        Some("Failed") => Phase::Failed,
        Some("Unknown") => Phase::Unknown,
        _ => Phase::Unspecified,
    }
}

/// Projects one watch event of a pod, given its facts, into a `PodEvent`.
pub fn project_facts(event_type: EventType, pod: &PodFacts) -> Result<PodEvent, ProjectionError> {
    // Without a uid the pod's events cannot be ordered.
    if pod.uid.is_none_or(str::is_empty) {
        return Err(ProjectionError::NoUid);
    }
    let owner = pod.labels.owner.ok_or(ProjectionError::NoOwner)?;
    let task = task_key(pod.annotations.as_ref())?;

    let phase = phase_named(pod.phase);
    let first_app = match pod.first_container {
        Some(name) => pod.app_statuses.iter().find(|s| s.name == name),
        None => pod.app_statuses.first(),
    };

    Ok(PodEvent {
        r#type: event_type.into(),
        pod: Some(pod.pod_ref()),
        owner: owner.to_owned(),
        task: Some(task),
        phase: phase.into(),
        status_reason: pod.status_reason.unwrap_or_default().to_owned(),
        deletion_unix_ms: pod.deletion_unix_ms,
        creation_unix_ms: pod.creation_unix_ms.unwrap_or(0),
        resource_version: pod.resource_version.unwrap_or_default().to_owned(),
        init_waiting: pod.init_statuses.iter().filter_map(waiting).collect(),
        first_app_waiting: first_app.and_then(waiting),
        terminated: pod
            .init_statuses
            .iter()
            .chain(&pod.app_statuses)
            .filter_map(terminated)
            .collect(),
        executor_done: is_true(pod.labels.done),
        revoked: is_true(pod.labels.revoked),
        synthesized: false,
        // Only the ingest's memory of the pod can say; see `known`.
        previous_sequence: None,
        signature: pod
            .annotations
            .as_ref()
            .and_then(|a| a.signature)
            .unwrap_or_default()
            .to_owned(),
    })
}

/// The TI key from annotations; labels of the same names are hashed by
/// Airflow and never used.
fn task_key(annotations: Option<&KeyAnnotations>) -> Result<TaskKey, ProjectionError> {
    let annotations = annotations.ok_or(ProjectionError::NoAnnotations)?;
    fn get(value: Option<&str>) -> Option<&str> {
        value.map(str::trim).filter(|v| !v.is_empty())
    }
    let need =
        |name: &'static str, value| get(value).ok_or(ProjectionError::MissingAnnotation(name));
    let integer = |name: &'static str, value: &str| {
        value
            .parse::<i64>()
            .map_err(|_| ProjectionError::NotAnInteger {
                annotation: name,
                value: value.to_owned(),
            })
    };

    let dag_id = need("dag_id", annotations.dag_id)?;
    let task_id = need("task_id", annotations.task_id)?;
    let try_number = integer("try_number", need("try_number", annotations.try_number)?)?;
    let map_index = get(annotations.map_index).map_or(Ok(-1), |v| integer("map_index", v))?;
    let run_id = get(annotations.run_id).unwrap_or_default();
    let logical_date = if run_id.is_empty() {
        get(annotations.logical_date)
            .or_else(|| get(annotations.execution_date))
            .ok_or(ProjectionError::NoRun)?
    } else {
        ""
    };
    let task_instance_id = match annotations.task_instance_id {
        None => String::new(),
        Some(value) => uuid::Uuid::try_parse(value.trim())
            .map_err(|_| ProjectionError::InvalidTaskInstanceId(value.to_owned()))?
            .hyphenated()
            .to_string(),
    };
    let key = TaskKey {
        dag_id: dag_id.to_owned(),
        task_id: task_id.to_owned(),
        run_id: run_id.to_owned(),
        map_index,
        try_number,
        logical_date: logical_date.to_owned(),
        task_instance_id,
    };
    key.check_bounds()?;
    Ok(key)
}

fn waiting(status: &StatusFacts) -> Option<ContainerWaiting> {
    let (reason, message) = status.waiting?;
    Some(ContainerWaiting {
        container: status.name.to_owned(),
        reason: reason.unwrap_or_default().to_owned(),
        message: message.unwrap_or_default().to_owned(),
    })
}

fn terminated(status: &StatusFacts) -> Option<ContainerTerminated> {
    let (exit_code, reason) = status.terminated?;
    Some(ContainerTerminated {
        container: status.name.to_owned(),
        exit_code,
        reason: reason.unwrap_or_default().to_owned(),
    })
}

/// A Kubernetes timestamp in Unix milliseconds.
pub(crate) fn unix_ms(time: &Time) -> i64 {
    time.0.as_millisecond()
}

fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

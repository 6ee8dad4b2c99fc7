//! The collector's two calls to the Kubernetes API: delete a pod on preconditions, and label
//! one done. What the API answered is typed, so the handler acks, waits or judges again.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use podstream_proto::v1::PodRef;
use serde_json::json;

/// The label Airflow's executor sets on a pod it is finished with.
pub const EXECUTOR_DONE_LABEL: &str = "airflow_executor_done";

/// The verbs on pods the collector's calls use with `settings`: `delete`, and `patch` when it
/// labels pods done instead (`delete_worker_pods` off).
pub fn verbs(settings: &crate::rule::Settings) -> Vec<&'static str> {
    if settings.delete_worker_pods {
        vec!["delete"]
    } else {
        vec!["delete", "patch"]
    }
}

/// What the API server did with a delete or a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Done as asked.
    Done,
    /// The pod was not there (404): someone else deleted it.
    Gone,
    /// A pod of that name with another uid is there (the pod was recreated): left alone.
    Replaced,
    /// The pod changed since it was judged (its resourceVersion precondition failed): judge
    /// it again.
    Changed,
}

impl Answer {
    /// Its name in logs and in the collector's bucket.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Done => "done",
            Answer::Gone => "gone",
            Answer::Replaced => "replaced",
            Answer::Changed => "changed",
        }
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A call the API server refused or never answered.
#[derive(Debug, thiserror::Error)]
#[error("{call} pod {namespace}/{name}")]
pub struct CallError {
    /// `deleting` or `labelling`.
    pub call: &'static str,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Why.
    #[source]
    pub source: kube::Error,
}

/// Deletes `pod` if it still has its uid and, when given, `resource_version`.
pub async fn delete(
    kube: &Client,
    pod: &PodRef,
    resource_version: Option<&str>,
) -> Result<Answer, CallError> {
    let api: Api<Pod> = Api::namespaced(kube.clone(), &pod.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: resource_version.map(str::to_owned),
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name, &params).await {
        Ok(_) => Ok(Answer::Done),
        Err(error) => answer(error, resource_version.is_some()).map_err(|source| CallError {
            call: "deleting",
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            source,
        }),
    }
}

/// Labels `pod` `airflow_executor_done=True` if it still has its uid (a JSON patch whose
/// first operation tests the uid).
pub async fn mark_done(kube: &Client, pod: &PodRef) -> Result<Answer, CallError> {
    let api: Api<Pod> = Api::namespaced(kube.clone(), &pod.namespace);
    let failed = |source| CallError {
        call: "labelling",
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        source,
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": pod.uid},
        {"op": "add", "path": format!("/metadata/labels/{EXECUTOR_DONE_LABEL}"), "value": "True"},
    ]))
    .map_err(|e| failed(kube::Error::SerdeError(e)))?;
    match api
        .patch(
            &pod.name,
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(_) => Ok(Answer::Done),
        // A failed test operation: the name is another pod's now.
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(Answer::Replaced),
        Err(error) => answer(error, false).map_err(failed),
    }
}

/// What a refusal means: 404 is gone; a 409 on the uid alone is a recreated pod, on a
/// resourceVersion too a changed one unless the server names the uid.
fn answer(error: kube::Error, with_resource_version: bool) -> Result<Answer, kube::Error> {
    match &error {
        kube::Error::Api(status) if status.code == 404 => Ok(Answer::Gone),
        kube::Error::Api(status) if status.code == 409 => {
            if !with_resource_version || status.message.contains("UID in precondition") {
                Ok(Answer::Replaced)
            } else {
                Ok(Answer::Changed)
            }
        }
        _ => Err(error),
    }
}

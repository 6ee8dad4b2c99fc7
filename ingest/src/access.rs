//! What the ingest may do in Kubernetes, asked before it starts: every permission its calls
//! use ([`needed`], pure), put to the API server as SelfSubjectAccessReviews ([`require`]). A
//! Role that lacks one stops the ingest at start with each missing permission named, where a
//! watch would otherwise retry a 403 for ever behind a pod that is up but never ready.
//!
//! The list is exactly what the ingest calls (the real API server's audit log of a whole run
//! shows the same verbs: `tests/tests/apiserver/kube_apiserver_deploy.rs`), and what
//! `deploy/base/rbac.yaml` grants.

use std::fmt;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use crate::leadership::LeaseConfig;

/// One permission: a verb on a resource, in a namespace (or the cluster), on one name or any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// `list`, `watch`, `get`, `create`, `update`, `patch`.
    pub verb: &'static str,
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The resource, plural.
    pub resource: &'static str,
    /// The namespace; `None` for every namespace.
    pub namespace: Option<String>,
    /// The object's name, where the call names one.
    pub name: Option<String>,
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        write!(f, "{} {}{group}", self.verb, self.resource)?;
        if let Some(name) = &self.name {
            write!(f, " {name:?}")?;
        }
        match &self.namespace {
            Some(namespace) => write!(f, " in namespace {namespace}"),
            None => write!(f, " in every namespace"),
        }
    }
}

/// The resources the ingest reads and writes.
const PODS: (&str, &str) = ("", "pods");
const LEASES: (&str, &str) = ("coordination.k8s.io", "leases");
const SPARK_APPLICATIONS: (&str, &str) = ("sparkoperator.k8s.io", "sparkapplications");

/// `verbs` on pods in each of `namespaces` (none: every namespace): what the collector's calls
/// use (`podstream check collect`), as the ingest's list and watch.
pub fn on_pods(verbs: &[&'static str], namespaces: &[String]) -> Vec<Permission> {
    in_namespaces(verbs, PODS, namespaces)
}

/// `verbs` on `resource`, unnamed, in each of `namespaces` (none: every namespace).
fn in_namespaces(
    verbs: &[&'static str],
    (group, resource): (&'static str, &'static str),
    namespaces: &[String],
) -> Vec<Permission> {
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    scopes
        .into_iter()
        .flat_map(|namespace| {
            verbs.iter().map(move |&verb| Permission {
                verb,
                group,
                resource,
                namespace: namespace.clone(),
                name: None,
            })
        })
        .collect()
}

/// Every permission the ingest's calls use, for the namespaces it watches (none: all), its
/// Lease (none: no election) and whether it watches Spark's objects.
pub fn needed(namespaces: &[String], lease: Option<&LeaseConfig>, spark: bool) -> Vec<Permission> {
    let permission =
        |verb, (group, resource): (&'static str, &'static str), namespace, name| Permission {
            verb,
            group,
            resource,
            namespace,
            name,
        };
    let mut needed = Vec::new();
    let mut watched = vec![PODS];
    if spark {
        watched.push(SPARK_APPLICATIONS);
    }
    for resource in watched {
        needed.extend(in_namespaces(&["list", "watch"], resource, namespaces));
    }
    if let Some(lease) = lease {
        let namespace = Some(lease.namespace.clone());
        // A Lease's name is not known to RBAC before it exists: create is asked unnamed.
        needed.push(permission("create", LEASES, namespace.clone(), None));
        // get and patch: the election; update: a restarted pod taking its Lease back.
        for verb in ["get", "patch", "update"] {
            needed.push(permission(
                verb,
                LEASES,
                namespace.clone(),
                Some(lease.name.clone()),
            ));
        }
    }
    needed
}

/// What the API server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Every permission is granted.
    Granted,
    /// The API server would not say (it serves no SelfSubjectAccessReview, as the simulator,
    /// or refused the review): the ingest goes on, and a missing permission shows as the
    /// watch's or the Lease's own error.
    NotAsked(String),
}

/// The ingest lacks permissions it needs.
#[derive(Debug, thiserror::Error)]
#[error(
    "the ingest's Kubernetes identity may not {missing} (RBAC); grant them in its Role \
     (deploy/base/rbac.yaml has what it needs)",
    missing = list(.missing)
)]
pub struct Forbidden {
    /// The permissions refused, in the order [`needed`] lists them.
    pub missing: Vec<Permission>,
}

fn list(missing: &[Permission]) -> String {
    missing
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Asks the API server about each permission; `Err` names every one refused.
pub async fn require(kube: &kube::Client, needed: &[Permission]) -> Result<Checked, Forbidden> {
    match review(kube, needed).await {
        Ok(answers) => {
            let missing: Vec<Permission> = answers
                .into_iter()
                .filter(|(_, allowed)| !allowed)
                .map(|(permission, _)| permission)
                .collect();
            if missing.is_empty() {
                Ok(Checked::Granted)
            } else {
                Err(Forbidden { missing })
            }
        }
        Err(reason) => {
            tracing::info!(%reason, "the ingest's permissions were not checked at start");
            Ok(Checked::NotAsked(reason))
        }
    }
}

/// Each permission with the API server's answer, in order; `Err` says why the server would
/// not answer (it serves no SelfSubjectAccessReview, or refused one).
pub async fn review(
    kube: &kube::Client,
    needed: &[Permission],
) -> Result<Vec<(Permission, bool)>, String> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(kube.clone());
    let mut answers = Vec::with_capacity(needed.len());
    for permission in needed {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(permission.verb.to_owned()),
                    group: Some(permission.group.to_owned()),
                    resource: Some(permission.resource.to_owned()),
                    namespace: permission.namespace.clone(),
                    name: permission.name.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| format!("SelfSubjectAccessReview: {error}"))?;
        let allowed = answer.status.is_some_and(|status| status.allowed);
        answers.push((permission.clone(), allowed));
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> LeaseConfig {
        LeaseConfig {
            namespace: "airflow".into(),
            name: "blue-ingest".into(),
            ..LeaseConfig::new()
        }
    }

    /// What each configuration asks for, as the Role must grant it.
    #[test]
    fn the_permissions_follow_the_configuration() {
        let rows: [(&[&str], bool, bool, &[&str]); 3] = [
            (
                &["airflow"],
                true,
                false,
                &[
                    "list pods in namespace airflow",
                    "watch pods in namespace airflow",
                    "create leases.coordination.k8s.io in namespace airflow",
                    "get leases.coordination.k8s.io \"blue-ingest\" in namespace airflow",
                    "patch leases.coordination.k8s.io \"blue-ingest\" in namespace airflow",
                    "update leases.coordination.k8s.io \"blue-ingest\" in namespace airflow",
                ],
            ),
            (
                &[],
                false,
                false,
                &[
                    "list pods in every namespace",
                    "watch pods in every namespace",
                ],
            ),
            (
                &["a", "b"],
                false,
                true,
                &[
                    "list pods in namespace a",
                    "watch pods in namespace a",
                    "list pods in namespace b",
                    "watch pods in namespace b",
                    "list sparkapplications.sparkoperator.k8s.io in namespace a",
                    "watch sparkapplications.sparkoperator.k8s.io in namespace a",
                    "list sparkapplications.sparkoperator.k8s.io in namespace b",
                    "watch sparkapplications.sparkoperator.k8s.io in namespace b",
                ],
            ),
        ];
        for (namespaces, elected, spark, want) in rows {
            let namespaces: Vec<String> = namespaces.iter().map(|n| (*n).to_owned()).collect();
            let lease = lease();
            let got: Vec<String> = needed(&namespaces, elected.then_some(&lease), spark)
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(
                got, want,
                "{namespaces:?}, elected {elected}, spark {spark}"
            );
        }
    }

    #[test]
    fn a_refusal_names_each_missing_permission() {
        let lease = lease();
        let missing: Vec<Permission> = needed(&["airflow".into()], Some(&lease), false)
            .into_iter()
            .filter(|p| p.verb == "watch" || p.verb == "update")
            .collect();
        let message = Forbidden { missing }.to_string();
        assert!(
            message.contains(
                "may not watch pods in namespace airflow, update leases.coordination.k8s.io \
                 \"blue-ingest\" in namespace airflow (RBAC)"
            ),
            "{message}"
        );
    }
}

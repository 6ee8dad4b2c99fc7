//! A component's Kubernetes identity (the ingest's, the collector's): its kubeconfig (or
//! in-cluster token) loads, and the API server grants each permission its calls use
//! (SelfSubjectAccessReview, as the ingest asks at its start).

use podstream_bus::fault::{Classified, Fault};
use podstream_ingest::access::{self, Permission};
use podstream_ingest::service::kube_client;

use super::Report;

/// One line for the client, then one per permission in `needed`; `role` says where a missing
/// one is granted.
pub(super) async fn check(
    report: &mut Report,
    context: Option<&str>,
    needed: &[Permission],
    role: &str,
) {
    let kube = match kube_client(context).await {
        Ok(kube) => kube,
        Err(error) => {
            report.fail(
                "kubernetes",
                error.fault(),
                format!("{:#}", anyhow::Error::new(error)),
            );
            return;
        }
    };
    match access::review(&kube, needed).await {
        Ok(answers) => {
            for (permission, allowed) in answers {
                let item = format!("kubernetes: {permission}");
                if allowed {
                    report.pass(item, "granted");
                } else {
                    report.fail(
                        item,
                        Fault::Configuration,
                        format!("not granted: add it to {role}"),
                    );
                }
            }
        }
        Err(reason) => report.fail("kubernetes", Fault::Unavailable, reason),
    }
}

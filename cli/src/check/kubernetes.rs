//! The ingest's Kubernetes identity: its kubeconfig (or in-cluster token) loads, and the API
//! server grants each permission its calls use (SelfSubjectAccessReview, as at its start).

use podstream_bus::fault::{Classified, Fault};
use podstream_ingest::access;
use podstream_ingest::service::{IngestConfig, kube_client};

use super::Report;

/// One line for the client, then one per permission.
pub(super) async fn check(report: &mut Report, config: &IngestConfig) {
    let kube = match kube_client(config.kube_context.as_deref()).await {
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
    let needed = access::needed(&config.namespaces, config.lease.as_ref(), config.spark);
    match access::review(&kube, &needed).await {
        Ok(answers) => {
            for (permission, allowed) in answers {
                let item = format!("kubernetes: {permission}");
                if allowed {
                    report.pass(item, "granted");
                } else {
                    report.fail(
                        item,
                        Fault::Configuration,
                        "not granted: add it to the ingest's Role (deploy/base/rbac.yaml, or the chart's)",
                    );
                }
            }
        }
        Err(reason) => report.fail("kubernetes", Fault::Unavailable, reason),
    }
}

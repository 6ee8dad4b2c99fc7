//! Where the pods are: the Kubernetes flags shared by `ingest`, `run` and `collect`.

use clap::Args;

/// Namespaces and kubeconfig context.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Namespaces of the worker pods (watched, or collected), comma-separated; all namespaces
    /// when empty.
    #[arg(long, env = "PODSTREAM_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    #[command(flatten)]
    pub context: KubeContextArgs,
}

/// Which kubeconfig context: for every command that calls the Kubernetes API.
#[derive(Debug, Clone, Args)]
pub struct KubeContextArgs {
    /// kubeconfig context to use instead of the current one.
    #[arg(long, env = "PODSTREAM_KUBE_CONTEXT")]
    pub kube_context: Option<String>,
}

/// Which worker pods are one Airflow deployment's.
#[derive(Debug, Clone, Args)]
pub struct PodSelectorArgs {
    /// Label selector narrowing the watch of worker pods to one Airflow deployment (e.g.
    /// `release=airflow-a`, the official chart's release label), for two deployments in one
    /// namespace; give each its own --prefix too [default: every pod with `airflow-worker`].
    #[arg(long, env = "PODSTREAM_POD_SELECTOR")]
    pub pod_selector: Option<String>,
}

impl KubeArgs {
    /// The namespaces given, without empty entries.
    pub fn namespaces(&self) -> Vec<String> {
        self.namespaces
            .iter()
            .filter(|n| !n.is_empty())
            .cloned()
            .collect()
    }
}

//! Where the pods are: the Kubernetes flags shared by `ingest` and `run`.

use clap::Args;

/// Namespaces and kubeconfig context.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Namespaces to watch, comma-separated; all namespaces when empty.
    #[arg(long, env = "PODSTREAM_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// kubeconfig context to use instead of the current one.
    #[arg(long, env = "PODSTREAM_KUBE_CONTEXT")]
    pub kube_context: Option<String>,
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

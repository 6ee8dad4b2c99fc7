//! `podstream kubelet`: the simulator's kubelet as a node of any Kubernetes API server
//! (`KUBECONFIG`): it registers a Node, binds the pods that name none, runs each pod's command
//! as a local process and writes the status a kubelet writes, until killed.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use podstream_sim::{Kubelet, KubeletConfig};

/// Flags of `podstream kubelet`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  KUBECONFIG=/tmp/admin.kubeconfig podstream kubelet --dir /tmp/node"
)]
pub struct KubeletArgs {
    /// Where pods get scratch working directories and logs [default: a new dir under $TMPDIR].
    #[arg(long, env = "PODSTREAM_KUBELET_DIR")]
    dir: Option<PathBuf>,
    /// At most this many pods run at once; the rest stay Pending (Unschedulable).
    #[arg(long, env = "PODSTREAM_KUBELET_MAX_PODS")]
    max_pods: Option<usize>,
    /// Run the pods of this namespace only [default: of every namespace].
    #[arg(long, env = "PODSTREAM_KUBELET_NAMESPACE")]
    namespace: Option<String>,
    /// A variable of the kubelet's own environment every pod gets, as an image's ENV would
    /// give it (repeat, or separate with commas). Pods get PATH, HOME, HOSTNAME and their own
    /// env besides, nothing else.
    #[arg(
        long = "env",
        value_name = "NAME",
        env = "PODSTREAM_KUBELET_ENV",
        value_delimiter = ','
    )]
    env: Vec<String>,
    #[command(flatten)]
    kube: crate::args::kube::KubeContextArgs,
}

/// Runs until SIGINT or SIGTERM.
pub fn run(args: &KubeletArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    runtime.block_on(async {
        let client =
            podstream_ingest::service::kube_client(args.kube.kube_context.as_deref()).await?;
        let root = args.dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("podstream-kubelet-{}", std::process::id()))
        });
        let config = KubeletConfig {
            root,
            max_pods: args.max_pods,
            passed_env: args.env.clone(),
        };
        let _kubelet = Kubelet::attach(client, args.namespace.clone(), config)?;
        tracing::info!(
            node = podstream_sim::kubelet::NODE_NAME,
            "the kubelet runs the node's pods"
        );
        crate::signal::shutdown_signal().await;
        Ok(())
    })
}

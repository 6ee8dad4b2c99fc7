//! `podstream sim`: serve the Kubernetes API simulator until killed, with a kubelet that runs
//! pods when asked (docs/contract.md §4).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use podstream_sim::{CustomResource, Kubelet, KubeletConfig, Server, SimConfig};

/// Flags of `podstream sim`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  podstream sim --listen 127.0.0.1:8001 --kubeconfig /tmp/sim.kubeconfig &\n  kubectl --kubeconfig /tmp/sim.kubeconfig get pods -A -w\n  podstream sim --kubeconfig /tmp/sim.kubeconfig --crd sim/crds/sparkapplications.yaml   # with SparkApplications"
)]
pub struct SimArgs {
    /// Address to serve the Kubernetes API on, over TLS (port 0 picks a free port). Loopback
    /// by default: with --kubelet it runs each pod's command as the user who started it, so
    /// serve it beyond this machine only on purpose.
    #[arg(long, env = "PODSTREAM_SIM_LISTEN", default_value = "127.0.0.1:8001")]
    listen: SocketAddr,
    /// A host name the API answers to besides loopback ones (the `Host` header: a web page
    /// that reaches the simulator through a name of its own is refused); repeatable.
    #[arg(
        long,
        env = "PODSTREAM_SIM_ALLOW_HOSTS",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    allow_host: Vec<String>,
    /// Where to write a kubeconfig for kubectl and the kube crate (0600: it holds the CA made
    /// at start and the bearer token every request must carry).
    #[arg(long, env = "PODSTREAM_SIM_KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Changes kept for watches and paged lists; reads from older resourceVersions get 410 Gone.
    #[arg(long, env = "PODSTREAM_SIM_RETAIN_EVENTS", default_value_t = SimConfig::default().retain_events)]
    retain_events: usize,
    /// Seconds between bookmarks on watches that allow them.
    #[arg(long, env = "PODSTREAM_SIM_BOOKMARK_SECONDS", default_value_t = 1)]
    bookmark_seconds: u64,
    /// Namespaces to create at start, beside default, kube-system, kube-public, kube-node-lease.
    #[arg(
        long,
        env = "PODSTREAM_SIM_NAMESPACES",
        value_delimiter = ',',
        default_value = "airflow"
    )]
    namespaces: Vec<String>,
    /// Also serve the custom resource a CustomResourceDefinition file (YAML or JSON) defines,
    /// its storage version, with no schema; repeatable. sim/crds/ has SparkApplication's.
    #[arg(
        long = "crd",
        env = "PODSTREAM_SIM_CRDS",
        value_delimiter = ',',
        value_name = "FILE"
    )]
    crds: Vec<PathBuf>,
    /// Run each pod as a node would: its first container's command as a local process, with
    /// the status a kubelet writes (phases, container states, exit codes, SIGTERM on delete).
    #[arg(long, env = "PODSTREAM_SIM_KUBELET")]
    kubelet: bool,
    /// With --kubelet: at most this many pods run at once; the rest stay Pending (Unschedulable).
    #[arg(long, env = "PODSTREAM_SIM_KUBELET_MAX_PODS", requires = "kubelet")]
    kubelet_max_pods: Option<usize>,
    /// With --kubelet: where pods get scratch working directories and logs
    /// [default: a fresh directory under the system's temp dir].
    #[arg(long, env = "PODSTREAM_SIM_KUBELET_DIR", requires = "kubelet")]
    kubelet_dir: Option<PathBuf>,
    /// With --kubelet: a variable of the simulator's own environment every pod gets, as an
    /// image's ENV would give it (repeat, or separate with commas). Pods get PATH, HOME,
    /// HOSTNAME and their own env besides, nothing else.
    #[arg(
        long = "kubelet-env",
        value_name = "NAME",
        env = "PODSTREAM_SIM_KUBELET_ENV",
        value_delimiter = ',',
        requires = "kubelet"
    )]
    kubelet_env: Vec<String>,
}

/// Serves until SIGINT or SIGTERM.
pub fn run(args: &SimArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the Tokio runtime")?;
    let custom_resources = args
        .crds
        .iter()
        .map(|file| CustomResource::load(file))
        .collect::<Result<Vec<_>, _>>()?;
    runtime.block_on(async {
        let config = SimConfig {
            retain_events: args.retain_events,
            bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
            namespaces: args.namespaces.clone(),
            custom_resources,
            allowed_hosts: args.allow_host.clone(),
        };
        let server = Server::start(args.listen, config).await?;
        let _kubelet = if args.kubelet {
            let root = args.kubelet_dir.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("podstream-sim-kubelet-{}", std::process::id()))
            });
            let config = KubeletConfig {
                root,
                max_pods: args.kubelet_max_pods,
                passed_env: args.kubelet_env.clone(),
            };
            Some(Kubelet::start(server.cluster().clone(), config)?)
        } else {
            None
        };
        server.write_kubeconfig(&args.kubeconfig)?;
        // Scripts wait for this one line before they use the server.
        let mut stdout = std::io::stdout();
        writeln!(stdout, "listening on {}", server.url()).context("writing to stdout")?;
        stdout.flush().context("writing to stdout")?;
        server.serve_until(crate::signal::shutdown_signal()).await;
        Ok(())
    })
}

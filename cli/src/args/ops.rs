//! `--metrics-listen`: Prometheus metrics, liveness and readiness over HTTP, for `ingest`,
//! `process`, `sink` and `run`.

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use podstream_bus::Health;

/// Where the operations endpoint listens.
#[derive(Debug, Clone, clap::Args)]
pub struct OpsArgs {
    /// Serve `/metrics` (Prometheus text), `/healthz` (alive) and `/readyz` (ready: 503 with
    /// the unmet conditions otherwise) on this address, e.g. 0.0.0.0:9090. Off when absent.
    #[arg(long, env = "PODSTREAM_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

/// Buckets of every duration histogram, in seconds: a millisecond to a minute.
const SECONDS_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 60.0,
];

impl OpsArgs {
    /// Installs the metrics exporter and serves the endpoint on the current runtime when an
    /// address is given; the returned [`Health`] is what the services report into.
    pub async fn serve(&self) -> anyhow::Result<Health> {
        let health = Health::new();
        let Some(address) = self.metrics_listen else {
            return Ok(health);
        };
        let metrics = PrometheusBuilder::new()
            .set_buckets(&SECONDS_BUCKETS)
            .context("histogram buckets")?
            .install_recorder()
            .context("installing the metrics recorder")?;
        metrics::gauge!(podstream_bus::metrics::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"))
            .set(1.0);
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .with_context(|| format!("listening on {address} (--metrics-listen)"))?;
        let app = router(metrics, health.clone());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "the metrics endpoint stopped");
            }
        });
        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
        Ok(health)
    }
}

fn router(metrics: PrometheusHandle, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(render))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state((metrics, health))
}

async fn render(State((metrics, _)): State<(PrometheusHandle, Health)>) -> String {
    metrics.render()
}

/// 200 when every declared condition is met, else 503; one `condition: met` line each.
async fn ready(State((_, health)): State<(PrometheusHandle, Health)>) -> (StatusCode, String) {
    let body: String = health
        .conditions()
        .iter()
        .map(|(condition, met)| {
            format!(
                "{}: {}\n",
                condition.name(),
                if *met { "ok" } else { "not ready" }
            )
        })
        .collect();
    let status = if health.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

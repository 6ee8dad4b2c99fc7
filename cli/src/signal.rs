//! Shutdown on SIGINT or SIGTERM, for every long-running subcommand.

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops podstream");
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

/// How long a stopping component may take to drain.
#[derive(Debug, Clone, clap::Args)]
pub struct ShutdownArgs {
    /// Seconds a component may take, after SIGINT or SIGTERM, to finish and ack what it holds;
    /// then it exits (code 1) even while NATS or the database is away, and what it had not
    /// acked is redelivered to the next instance.
    #[arg(long, env = "PODSTREAM_SHUTDOWN_TIMEOUT_SECONDS", default_value_t = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS)]
    pub shutdown_timeout_seconds: u64,
}

/// Seconds a stopping component may take to drain, by default: within Kubernetes' default
/// grace period of 30 s, so the component exits on its own terms rather than by SIGKILL.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECONDS: u64 = 25;

impl ShutdownArgs {
    /// Runs `service`, handed the shutdown signal, to its end; once the signal has come it
    /// has the timeout to drain, after which it is given up (dropped) with an error.
    pub async fn run<T, E, F>(
        &self,
        service: impl FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> F,
    ) -> anyhow::Result<T>
    where
        E: Into<anyhow::Error>,
        F: std::future::Future<Output = Result<T, E>>,
    {
        let timeout = std::time::Duration::from_secs(self.shutdown_timeout_seconds);
        let (signalled, heard) = tokio::sync::oneshot::channel::<()>();
        let service = service(Box::pin(async move {
            shutdown_signal().await;
            let _ = signalled.send(());
        }));
        tokio::pin!(service);
        let deadline = async {
            match heard.await {
                Ok(()) => tokio::time::sleep(timeout).await,
                // The service ended without a signal: no deadline.
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            result = &mut service => result.map_err(Into::into),
            () = deadline => Err(anyhow::anyhow!(
                "did not finish draining within {timeout:?} of the signal (--shutdown-timeout-seconds); what was not acked will be redelivered"
            )),
        }
    }
}

//! The ingest service run in the test's own process: started with a config and a client,
//! then stopped as SIGTERM would (drained, its checkpoint flushed) or killed as `kill -9`
//! would. [`crate::component`] runs it as its own process instead.

use podstream_ingest::service::{self, IngestConfig, IngestError, IngestStats};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running in-process ingest.
pub struct InProcessIngest {
    task: JoinHandle<Result<IngestStats, IngestError>>,
    stop: oneshot::Sender<()>,
}

impl InProcessIngest {
    /// Runs `podstream ingest`'s service with `config` on `kube` in a task of this runtime.
    pub fn start(config: IngestConfig, kube: kube::Client) -> InProcessIngest {
        crate::init_tracing();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(service::run(config, kube, async move {
            let _ = stopped.await;
        }));
        InProcessIngest { task, stop }
    }

    /// A stand-in while the ingest is down: stopping it is a no-op.
    pub fn down() -> InProcessIngest {
        let (stop, _) = oneshot::channel();
        InProcessIngest {
            task: tokio::spawn(async { Ok(IngestStats::default()) }),
            stop,
        }
    }

    /// Stops it as SIGTERM would and returns what it did.
    ///
    /// # Panics
    /// When the service failed or panicked: the test is over.
    pub async fn stop(self) -> IngestStats {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(Ok(stats)) => stats,
            Ok(Err(e)) => panic!("the ingest failed: {e}"),
            Err(e) => panic!("the ingest's task: {e}"),
        }
    }

    /// What the service returned once it ended by itself (a refusal at start, say).
    ///
    /// # Panics
    /// When its task panicked.
    pub async fn ended(self) -> Result<IngestStats, IngestError> {
        self.task
            .await
            .unwrap_or_else(|e| panic!("the ingest's task: {e}"))
    }

    /// As kill -9 would: no drain, no checkpoint flush, the connection just drops.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

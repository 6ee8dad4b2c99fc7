//! Connecting to NATS: retry with backoff at start, never a silent crash loop.

use std::time::Duration;

/// Connects to `url` (one server, or several comma-separated: the members of a cluster),
/// retrying with exponential backoff (up to 30 s between attempts) and logging every failed
/// attempt. The client then reconnects by itself after a lost connection, to any member.
pub async fn connect(url: &str, name: &str) -> async_nats::Client {
    let servers: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|server| !server.is_empty())
        .collect();
    let mut backoff = crate::Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
    let mut attempt = 1u32;
    loop {
        let options = async_nats::ConnectOptions::new()
            .name(name)
            .connection_timeout(Duration::from_secs(5))
            // Unlimited: a NATS restart must never end the component.
            .max_reconnects(None)
            .event_callback(|event| async move {
                match event {
                    async_nats::Event::Disconnected => {
                        tracing::warn!("disconnected from NATS; reconnecting")
                    }
                    async_nats::Event::Connected => tracing::info!("connected to NATS"),
                    other => tracing::debug!(%other, "NATS event"),
                }
            });
        match options.connect(servers.as_slice()).await {
            Ok(client) => {
                tracing::info!(url, "connected to NATS");
                return client;
            }
            Err(error) => {
                tracing::warn!(url, attempt, retry_in_ms = backoff.delay().as_millis() as u64, %error, "NATS unreachable; retrying");
                backoff.wait().await;
                attempt += 1;
            }
        }
    }
}

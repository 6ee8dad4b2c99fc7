//! A watch driven in a task of its own, its items read ahead of the publishing loop.

use futures::StreamExt;
use futures::stream::BoxStream;

/// Drives `stream` in a task of its own, up to `depth` items ahead of its reader, keeping
/// their order. The watch parses and projects pods as it reads them (see [`crate::watched_pod::WatchedPod`]), so a list's next pages are fetched and projected on one core while the last
/// ones are published from the other. The task ends when the receiver is dropped.
pub fn read_ahead<T: Send + 'static>(
    mut stream: BoxStream<'static, T>,
    depth: usize,
) -> tokio::sync::mpsc::Receiver<T> {
    let (ahead, reader) = tokio::sync::mpsc::channel(depth.max(1));
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                () = ahead.closed() => break,
                item = stream.next() => item,
            };
            let Some(item) = item else { break };
            if ahead.send(item).await.is_err() {
                break;
            }
        }
    });
    reader
}

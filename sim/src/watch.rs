//! Watch streams: replay the change log from a resourceVersion, filtered per watch with the
//! selector transitions of kube-apiserver, plus bookmarks, timeouts and 410 Gone.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::object::Stored;
use crate::resource::Resource;
use crate::selector::Filter;
use crate::status::ApiError;
use crate::store::{Change, Event};
use crate::table;

/// How many log entries a watch reads per lock.
const BATCH: usize = 1024;

/// What a watch asked for.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// The watched resource.
    pub resource: Resource,
    /// What is selected.
    pub filter: Filter,
    /// Replay changes after this revision; `None` starts with every selected object as ADDED.
    pub from: Option<u64>,
    /// `sendInitialEvents=true`: end the initial ADDED events with a marked bookmark.
    pub send_initial_events: bool,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// Objects (the default) or one-row Tables for `kubectl get -w`.
    pub format: Format,
}

/// How objects are written in events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The object itself.
    Object,
    /// A `Table` with one row; `full` embeds the whole object.
    Table {
        /// Whether rows carry the whole object rather than its metadata.
        full: bool,
    },
}

/// The event type a watch with this filter sees for a change, if any.
pub fn event_type(filter: &Filter, event: &Event) -> Option<&'static str> {
    let now = filter.matches(&event.object);
    let before = event.old.as_ref().is_some_and(|old| filter.matches(old));
    match (event.change, before, now) {
        (Change::Added, _, true) => Some("ADDED"),
        (Change::Deleted, _, true) | (Change::Deleted, true, _) => Some("DELETED"),
        (Change::Modified, true, true) => Some("MODIFIED"),
        (Change::Modified, false, true) => Some("ADDED"),
        // Leaving the selection looks like a deletion to this watch, with the new state.
        (Change::Modified, true, false) => Some("DELETED"),
        _ => None,
    }
}

/// Starts a watch; the receiver yields chunks of newline-delimited watch events.
pub fn start(cluster: Cluster, request: WatchRequest) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        if let Err(reason) = run(cluster, request, tx).await {
            tracing::debug!(reason, "watch ended");
        }
    });
    rx
}

struct Writer {
    resource: Resource,
    format: Format,
    columns_sent: bool,
    tx: mpsc::Sender<Bytes>,
}

impl Writer {
    fn line(&mut self, chunk: &mut BytesMut, kind: &str, object: &Stored) {
        chunk.extend_from_slice(b"{\"type\":\"");
        chunk.extend_from_slice(kind.as_bytes());
        chunk.extend_from_slice(b"\",\"object\":");
        match self.format {
            Format::Object => chunk.extend_from_slice(&object.json),
            Format::Table { full } => {
                let value = object.value().unwrap_or_default();
                let row = table::row(self.resource, &value, full);
                let with_columns = !self.columns_sent;
                self.columns_sent = true;
                let table = table::table(
                    self.resource,
                    vec![row],
                    object.resource_version,
                    None,
                    with_columns,
                );
                chunk.extend_from_slice(table.to_string().as_bytes());
            }
        }
        chunk.extend_from_slice(b"}\n");
    }

    fn value_line(chunk: &mut BytesMut, kind: &str, object: &Value) {
        let line = json!({ "type": kind, "object": object });
        chunk.extend_from_slice(line.to_string().as_bytes());
        chunk.extend_from_slice(b"\n");
    }

    fn bookmark(&self, chunk: &mut BytesMut, rv: u64, initial_end: bool) {
        let mut metadata = json!({ "resourceVersion": rv.to_string(), "creationTimestamp": null });
        if initial_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        let object = json!({
            "kind": self.resource.kind(),
            "apiVersion": self.resource.api_version(),
            "metadata": metadata,
        });
        Self::value_line(chunk, "BOOKMARK", &object);
    }

    async fn send(&self, chunk: BytesMut) -> Result<(), &'static str> {
        if chunk.is_empty() {
            return Ok(());
        }
        self.tx
            .send(chunk.freeze())
            .await
            .map_err(|_| "client went away")
    }
}

async fn run(
    cluster: Cluster,
    request: WatchRequest,
    tx: mpsc::Sender<Bytes>,
) -> Result<(), &'static str> {
    let mut head = cluster.subscribe();
    let mut restarts = cluster.restarts();
    restarts.borrow_and_update();
    let mut writer = Writer {
        resource: request.resource,
        format: request.format,
        columns_sent: false,
        tx,
    };
    head.borrow_and_update();
    let mut cursor = match request.from {
        Some(rv) => rv,
        None => {
            let (objects, rv) = cluster.current(request.resource, &request.filter);
            for batch in objects.chunks(BATCH) {
                let mut chunk = BytesMut::new();
                for object in batch {
                    writer.line(&mut chunk, "ADDED", object);
                }
                writer.send(chunk).await?;
            }
            rv
        }
    };
    if request.send_initial_events && request.bookmarks {
        let mut chunk = BytesMut::new();
        writer.bookmark(&mut chunk, cursor, true);
        writer.send(chunk).await?;
    }
    let deadline = request.timeout.map(|t| Instant::now() + t);
    let mut ticker = tokio::time::interval(cluster.config().bookmark_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        head.borrow_and_update();
        loop {
            let events = match cluster.events_after(cursor, BATCH) {
                Ok(events) => events,
                Err(gone) => return send_error(&writer, &gone).await,
            };
            if events.is_empty() {
                break;
            }
            // A restart cuts the watch at once, even in the middle of a backlog.
            if restarts.has_changed().unwrap_or(true) {
                return Err("dropped");
            }
            let mut chunk = BytesMut::new();
            for event in &events {
                cursor = event.rv;
                if let Some(kind) = event_type(&request.filter, event) {
                    writer.line(&mut chunk, kind, &event.object);
                }
            }
            writer.send(chunk).await?;
        }
        let latency = cluster.latency();
        tokio::select! {
            changed = head.changed() => {
                changed.map_err(|_| "cluster gone")?;
                if !latency.is_zero() {
                    tokio::time::sleep(latency).await;
                }
            }
            _ = restarts.changed() => return Err("dropped"),
            _ = sleep_until(deadline) => return Ok(()),
            _ = ticker.tick(), if request.bookmarks => {
                let mut chunk = BytesMut::new();
                writer.bookmark(&mut chunk, cursor, false);
                writer.send(chunk).await?;
            }
            _ = writer.tx.closed() => return Err("client went away"),
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn send_error(writer: &Writer, error: &ApiError) -> Result<(), &'static str> {
    let mut chunk = BytesMut::new();
    Writer::value_line(&mut chunk, "ERROR", &error.to_status());
    writer.send(chunk).await?;
    Err("expired")
}
